"""Every MINILLM_* environment variable: one table, and the only module that reads them.

Each variable is declared once in VARIABLES (name, type, default, allowed values, what it changes, which
part reads it), and the code reads it through a small accessor below, at call time: nothing here caches,
so a test's monkeypatch.setenv takes effect at the next call (a caller that reads once, such as
models/fused.py at import, caches on its own side). A bad value raises ValueError where the reading code
validates it. Code that sets a variable for a child process uses the name constants (MINILLM_...).

The rows marked script-only are read by scripts/ and .ci/ (and the tests), never by the package; they are
listed so that one table names every switch. book/environment.md carries `markdown_table()`
(`markdown_chapter()` is the whole page; tests/test_envs.py checks the two agree).

Stdlib only: every part of minillm may import this module without risk of an import cycle.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: what it is, its default and values, and who reads it."""

    name: str
    type: str  # "str", "choice", "bool", "float", "int" or "path": how the value is parsed
    default: str  # what applies when it is unset, in words or as the value
    values: str  # the values it takes
    meaning: str  # one line: what it changes
    reader: str  # the module (or script) that reads it
    script_only: bool = False  # read by scripts/ or .ci/ (or the tests), not by the package


# ---------------------------------------------------------------------------------------------- names
MINILLM_API_KEY = "MINILLM_API_KEY"
MINILLM_CACHE_DIR = "MINILLM_CACHE_DIR"
MINILLM_COMPILED_BODY = "MINILLM_COMPILED_BODY"
MINILLM_COMPILE_DIRECT_CALLS = "MINILLM_COMPILE_DIRECT_CALLS"
MINILLM_COMPILE_GUARDS = "MINILLM_COMPILE_GUARDS"
MINILLM_COMPILE_WRAPPER = "MINILLM_COMPILE_WRAPPER"
MINILLM_CPU_ATTENTION = "MINILLM_CPU_ATTENTION"
MINILLM_CPU_PREFILL_ATTENTION = "MINILLM_CPU_PREFILL_ATTENTION"
MINILLM_DECODE_STEP = "MINILLM_DECODE_STEP"
MINILLM_EXERCISES = "MINILLM_EXERCISES"
MINILLM_FAST_PATH = "MINILLM_FAST_PATH"
MINILLM_FUSED_KERNELS = "MINILLM_FUSED_KERNELS"
MINILLM_GGUF_KERNELS = "MINILLM_GGUF_KERNELS"
MINILLM_HUGE_PAGES = "MINILLM_HUGE_PAGES"
MINILLM_INT8_GEMM = "MINILLM_INT8_GEMM"
MINILLM_MALLOC = "MINILLM_MALLOC"
MINILLM_MKL_PACK = "MINILLM_MKL_PACK"
MINILLM_MKL_PACK_MB = "MINILLM_MKL_PACK_MB"
MINILLM_PANELS = "MINILLM_PANELS"
MINILLM_QUANT_CPU_ROUTE = "MINILLM_QUANT_CPU_ROUTE"
MINILLM_QUANT_DEQUANT_FALLBACK = "MINILLM_QUANT_DEQUANT_FALLBACK"
MINILLM_RANKING_HEAD = "MINILLM_RANKING_HEAD"
MINILLM_SKINNY = "MINILLM_SKINNY"
MINILLM_TILED = "MINILLM_TILED"
# script-only (scripts/, .ci/, tests/): declared for the table; the package never reads them
MINILLM_BROWSER_SCREENSHOT = "MINILLM_BROWSER_SCREENSHOT"
MINILLM_CHROMIUM = "MINILLM_CHROMIUM"
MINILLM_EXECUTED_NOTEBOOKS = "MINILLM_EXECUTED_NOTEBOOKS"
MINILLM_NOTEBOOK_LANES = "MINILLM_NOTEBOOK_LANES"
MINILLM_QUICK = "MINILLM_QUICK"
MINILLM_TESTS_PINNED_ROUTE = "MINILLM_TESTS_PINNED_ROUTE"
MINILLM_TEST_MODELS = "MINILLM_TEST_MODELS"
MINILLM_TEST_WORKERS = "MINILLM_TEST_WORKERS"
MINILLM_TORCH_VERSION = "MINILLM_TORCH_VERSION"
MINILLM_TRITON_VERSION = "MINILLM_TRITON_VERSION"

COMPILED_BODY_LAYOUTS = ("row-major", "k-major")
QUANT_CPU_ROUTES = ("bf16", "blocks")
INT8_GEMM_KERNELS = ("int_mm", "float32")
MKL_PACK_MB_DEFAULT = 1024

VARIABLES: tuple[EnvVar, ...] = (
    # ------------------------------------------------------------------------------------ the package
    EnvVar(MINILLM_API_KEY, "str", "unset", "a secret",
           "the key `minillm serve` requires as `Authorization: Bearer <key>` on /v1/* (as --api-key; the flag wins)",
           "server/cli.py"),
    EnvVar(MINILLM_CACHE_DIR, "path", "~/.cache/minillm", "a folder",
           "where assembled models (in its models/ subfolder: ~/.cache/minillm/models by default), built CPU "
           "kernels and measured roofs are kept",
           "loader/registry.py, minillm/cpu/kernels/gguf_cpu.py, roofline/roofs.py"),
    EnvVar(MINILLM_COMPILED_BODY, "choice", "chosen by the CPU (tiled_cpu.outruns_mkl)", "row-major, k-major",
           "how a compiled float32 CPU engine stores its layers' weights; any other value is an error",
           "engine/model_runner.py"),
    EnvVar(MINILLM_COMPILE_DIRECT_CALLS, "bool", "1", "0, 1",
           "0: a compiled CPU graph's C++ wrapper calls the custom ops through the dispatcher, not directly",
           "engine/compile.py"),
    EnvVar(MINILLM_COMPILE_GUARDS, "choice", "seen", "seen, always",
           "always: torch.compile's guards run on every call (default: skipped for input shapes seen before)",
           "engine/compile.py"),
    EnvVar(MINILLM_COMPILE_WRAPPER, "choice", "cpp", "cpp, python",
           "python: inductor's wrapper stays Python on the CPU (default: C++, asserts off)",
           "engine/compile.py"),
    EnvVar(MINILLM_CPU_ATTENTION, "choice", "the C++ kernel", "torch",
           "torch: CPU paged attention gathers K/V in PyTorch instead of the C++ kernel",
           "minillm/cpu/kernels/paged_attention_cpu.py"),
    EnvVar(MINILLM_CPU_PREFILL_ATTENTION, "choice", "the C++ kernel", "torch",
           "torch: CPU prefill attention runs torch's SDPA instead of the C++ kernel",
           "minillm/cpu/kernels/prefill_attention_cpu.py"),
    EnvVar(MINILLM_DECODE_STEP, "choice", "the one-region C++ step", "ops",
           "ops: a CPU decode step runs op by op instead of the one-region C++ step",
           "minillm/cpu/kernels/decode_step_cpu.py"),
    EnvVar(MINILLM_FAST_PATH, "choice", "auto", "auto, off, require",
           "the default of EngineConfig.fast_path (e.g. the test suite's plain-path run)",
           "engine/config.py"),
    EnvVar(MINILLM_EXERCISES, "str", "unset (the reference code)", "learner, or learner:name,name",
           "swaps the course's exercise stubs in at import",
           "minillm/__init__.py, exercises.py"),
    EnvVar(MINILLM_FUSED_KERNELS, "bool", "1", "0, 1",
           "0: the plain PyTorch norm and RoPE layers instead of the fused kernels; read once, at import",
           "models/fused.py"),
    EnvVar(MINILLM_GGUF_KERNELS, "choice", "the GGUF block kernels where they build", "int4",
           "int4: GGUF files map onto int4 groups on a CPU too (the portable route)",
           "quant/apply.py, loader/gguf.py"),
    EnvVar(MINILLM_HUGE_PAGES, "bool", "1", "0, 1",
           "0: weights stay where the loader put them (not moved into 2 MB pages)",
           "minillm/cpu/huge_pages.py"),
    EnvVar(MINILLM_INT8_GEMM, "choice", "chosen by the CPU's int8 instructions", "int_mm, float32",
           "forces W8A8's integer GEMM (torch._int_mm) or the float32 one; any other value is an error",
           "quant/w8a8.py"),
    EnvVar(MINILLM_MALLOC, "choice", "glibc thresholds raised", "system",
           "system: glibc's malloc settings are left alone", "minillm/cpu/memory.py"),
    EnvVar(MINILLM_MKL_PACK, "bool", "1", "0, 1",
           "0: no MKL-packed weight copies on Intel CPUs (F.linear runs)", "minillm/cpu/kernels/mkl_packed.py"),
    EnvVar(MINILLM_MKL_PACK_MB, "float", str(MKL_PACK_MB_DEFAULT), "MiB",
           "the most memory the MKL-packed weight copies may hold", "minillm/cpu/kernels/mkl_packed.py"),
    EnvVar(MINILLM_PANELS, "choice", "speculative engines only", "0, 1",
           "0: never pack few-row panels; 1: in every eager float32 CPU engine",
           "minillm/cpu/panels.py, minillm/cpu/kernels/panel_cpu.py"),
    EnvVar(MINILLM_QUANT_CPU_ROUTE, "choice", "chosen by the CPU's bf16 support", "bf16, blocks",
           "how int8/int4 layers multiply on a CPU; any other value is an error",
           "quant/cpu_route.py, roofline/machine.py"),
    EnvVar(MINILLM_QUANT_DEQUANT_FALLBACK, "bool", "unset (an error)", "1",
           "1: quantized layers on CUDA without the Triton kernels dequantize the whole weight every call",
           "quant/linear.py"),
    EnvVar(MINILLM_RANKING_HEAD, "choice", "q8_0", "q8_0, float",
           "float: a float target's cut ranking head for draft guesses stays float (not Q8_0)",
           "spec_decode/draft_vocab.py"),
    EnvVar(MINILLM_SKINNY, "choice", "the few-row C++ kernel", "mkl",
           "mkl: few-row float32 linears use MKL instead of the C++ kernel", "minillm/cpu/kernels/skinny_cpu.py"),
    EnvVar(MINILLM_TILED, "choice", "measured at start-up", "mkl, full, all",
           "the batched float32 tiled kernel: mkl off, full over every CPU's ranges, all at every row count",
           "minillm/cpu/kernels/tiled_cpu.py"),
    # ------------------------------------------------------------------------------------ script-only
    EnvVar(MINILLM_BROWSER_SCREENSHOT, "path", "unset", "a file",
           "where the real-browser test saves a screenshot of the page", "tests/test_browser.py",
           script_only=True),
    EnvVar(MINILLM_CHROMIUM, "path", "/usr/bin/chromium", "a file",
           "the Chromium the real-browser test drives", "scripts/test.sh, tests/test_browser.py",
           script_only=True),
    EnvVar(MINILLM_EXECUTED_NOTEBOOKS, "path", "unset", "a folder",
           "where executed notebooks are kept, and the book takes them from",
           "scripts/build_book.sh, scripts/run_notebooks.py, notebooks/conftest.py", script_only=True),
    EnvVar(MINILLM_NOTEBOOK_LANES, "int", "2", "a count",
           "parallel CPU-pinned lanes for the notebooks", "scripts/run_notebooks.py", script_only=True),
    EnvVar(MINILLM_QUICK, "bool", "0", "0, 1",
           "1: only the tests not marked slow", "scripts/test.sh", script_only=True),
    EnvVar(MINILLM_TESTS_PINNED_ROUTE, "bool", "unset", "1",
           "set by the tests' conftest where it pinned MINILLM_QUANT_CPU_ROUTE itself",
           "tests/conftest.py, tests/test_notebooks.py", script_only=True),
    EnvVar(MINILLM_TEST_MODELS, "bool", "1", "0, 1",
           "0: the test run leaves the real registered models out", "scripts/test.sh, .ci/run",
           script_only=True),
    EnvVar(MINILLM_TEST_WORKERS, "int", "2", "a count",
           "pytest-xdist workers for the test run (1: in one process)", "scripts/test.sh", script_only=True),
    EnvVar(MINILLM_TORCH_VERSION, "str", "2.13.0", "a version",
           "the torch version the installer pins", "scripts/install.sh", script_only=True),
    EnvVar(MINILLM_TRITON_VERSION, "str", "3.7.1", "a version",
           "the Triton version the installer pins (no GPU)", "scripts/install.sh", script_only=True),
)

DECLARED: dict[str, EnvVar] = {v.name: v for v in VARIABLES}


# ---------------------------------------------------------------------------------------------- reading
def get(name: str) -> str | None:
    """The raw value of a declared variable, or None where it is unset (KeyError for an undeclared name)."""
    if name not in DECLARED:
        raise KeyError(f"{name} is not declared in minillm/envs.py")
    return os.environ.get(name)


def turned_off(name: str, off: str) -> bool:
    """Whether a kernel switch is set to its off value (compared case-insensitively): e.g. MINILLM_SKINNY=mkl."""
    return (get(name) or "").lower() == off


def api_key() -> str | None:
    """MINILLM_API_KEY: the server's API key; None where unset or empty."""
    return get(MINILLM_API_KEY) or None


def cache_dir() -> str | None:
    """MINILLM_CACHE_DIR, or None where it is unset or empty (each caller keeps its own default folder)."""
    return get(MINILLM_CACHE_DIR) or None


def compiled_body() -> str | None:
    """MINILLM_COMPILED_BODY: "row-major" or "k-major", None where unset (the CPU decides)."""
    layout = get(MINILLM_COMPILED_BODY)
    if layout is not None and layout not in COMPILED_BODY_LAYOUTS:
        raise ValueError(f"{MINILLM_COMPILED_BODY} must be one of {COMPILED_BODY_LAYOUTS}, got {layout!r}")
    return layout


def compile_direct_calls() -> bool:
    """False where MINILLM_COMPILE_DIRECT_CALLS=0 (a C++ wrapper calls the ops through the dispatcher)."""
    return os.environ.get(MINILLM_COMPILE_DIRECT_CALLS, "1") != "0"


def compile_skip_seen_guards() -> bool:
    """False where MINILLM_COMPILE_GUARDS=always (every call runs torch.compile's guards)."""
    return os.environ.get(MINILLM_COMPILE_GUARDS, "seen") != "always"


def compile_cpp_wrapper() -> bool:
    """False where MINILLM_COMPILE_WRAPPER=python (inductor keeps its Python wrapper on the CPU)."""
    return os.environ.get(MINILLM_COMPILE_WRAPPER, "cpp") != "python"


def fast_path() -> str:
    """MINILLM_FAST_PATH: the default of EngineConfig.fast_path ("auto" where unset)."""
    value = os.environ.get(MINILLM_FAST_PATH, "auto")
    if value not in ("auto", "off", "require"):
        raise ValueError(f"{MINILLM_FAST_PATH} must be one of ('auto', 'off', 'require'), got {value!r}")
    return value


def exercises() -> str:
    """MINILLM_EXERCISES, stripped; "" where unset."""
    return os.environ.get(MINILLM_EXERCISES, "").strip()


def fused_kernels() -> bool:
    """False where MINILLM_FUSED_KERNELS=0 (the plain PyTorch layers run)."""
    return os.environ.get(MINILLM_FUSED_KERNELS, "1") != "0"


def gguf_int4() -> bool:
    """Whether MINILLM_GGUF_KERNELS=int4 asks for the portable int4 mapping of GGUF files."""
    return get(MINILLM_GGUF_KERNELS) == "int4"


def huge_pages() -> bool:
    """False where MINILLM_HUGE_PAGES=0 (the weights stay where the loader put them)."""
    return os.environ.get(MINILLM_HUGE_PAGES, "1") != "0"


def int8_gemm() -> str | None:
    """MINILLM_INT8_GEMM: "int_mm" or "float32"; None where unset or empty (the CPU decides)."""
    forced = get(MINILLM_INT8_GEMM)
    if not forced:
        return None
    if forced not in INT8_GEMM_KERNELS:
        raise ValueError(f"{MINILLM_INT8_GEMM} must be 'int_mm' or 'float32', got {forced!r}")
    return forced


def malloc_system() -> bool:
    """Whether MINILLM_MALLOC=system leaves glibc's malloc settings alone."""
    return os.environ.get(MINILLM_MALLOC, "").lower() == "system"


def mkl_pack() -> bool:
    """False where MINILLM_MKL_PACK=0 (no MKL-packed weight copies)."""
    return os.environ.get(MINILLM_MKL_PACK, "1") != "0"


def mkl_pack_mb() -> float:
    """MINILLM_MKL_PACK_MB: the MiB all MKL-packed copies may hold (default MKL_PACK_MB_DEFAULT)."""
    value = os.environ.get(MINILLM_MKL_PACK_MB, MKL_PACK_MB_DEFAULT)
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{MINILLM_MKL_PACK_MB} must be a number of MiB, got {value!r}") from None


def panels() -> str:
    """MINILLM_PANELS as set: "0" (never), "1" (every eager float32 CPU engine), "" where unset."""
    return os.environ.get(MINILLM_PANELS, "")


def quant_cpu_route() -> str | None:
    """MINILLM_QUANT_CPU_ROUTE: "bf16" or "blocks"; None where unset or empty (the CPU decides)."""
    forced = get(MINILLM_QUANT_CPU_ROUTE)
    if not forced:
        return None
    if forced not in QUANT_CPU_ROUTES:
        raise ValueError(f"{MINILLM_QUANT_CPU_ROUTE} must be one of {QUANT_CPU_ROUTES}, got {forced!r}")
    return forced


def quant_dequant_fallback() -> bool:
    """Whether MINILLM_QUANT_DEQUANT_FALLBACK=1 lets quantized CUDA layers dequantize without Triton."""
    return get(MINILLM_QUANT_DEQUANT_FALLBACK) == "1"


def ranking_head_q8_0() -> bool:
    """False where MINILLM_RANKING_HEAD=float (a cut ranking head stays float)."""
    return os.environ.get(MINILLM_RANKING_HEAD, "q8_0") != "float"


def tiled() -> str:
    """MINILLM_TILED, lower-cased: "mkl", "full", "all", or "" where unset."""
    return os.environ.get(MINILLM_TILED, "").lower()


# ---------------------------------------------------------------------------------------------- the docs
def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """The table in book/environment.md: variable, default, values, what it changes (script-only rows last)."""
    rows = ["| Variable | Default | Values | What it changes |", "| --- | --- | --- | --- |"]
    for v in VARIABLES:
        meaning = f"{v.meaning} ({'script only: ' if v.script_only else 'read by '}{v.reader})"
        rows.append(f"| `{v.name}` | {_cell(v.default)} | {_cell(v.values)} | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


CHAPTER_INTRO = """# Runtime switches

minillm reads a few environment variables: switches that turn a kernel off, force a choice the engine
otherwise makes from the machine, or move its cache. None is needed; each default is what the engine
does without it. They are declared in one place, `minillm/envs.py`, which is also the only module that
reads them, and this table is generated from it (`minillm.envs.markdown_chapter()`). The last rows
are read only by the scripts and the tests, never by the engine.

"""


def markdown_chapter() -> str:
    """book/environment.md in full: a short introduction and `markdown_table()`."""
    return CHAPTER_INTRO + markdown_table()
