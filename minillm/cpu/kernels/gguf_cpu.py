"""Build and load the C++ GGUF block kernels (minillm/cpu/kernels/gguf_matmul.cpp) for this CPU.

The kernels multiply a GGUF tensor's own bytes (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K,
Q6_K) by an activation quantized to int8 blocks of 32, as llama.cpp does; see
the .cpp header for the formats. They are compiled on first use with the
machine's compiler (torch.utils.cpp_extension, about 16-20 s here, once; cached under
the minillm cache folder, keyed by the source, the flags and the CPU's flags so
a build never runs on a CPU it was not built for).

Which instructions: ``-march=native`` by default, so the build uses what this
CPU has (AVX2; VNNI dot products on AVX-512 VNNI or AVX-VNNI CPUs). Setting
``ATEN_CPU_CAPABILITY`` -- torch's own switch for its CPU kernels -- to ``avx2``
or ``default`` builds the AVX2-only or the portable C++ path instead, so an
AVX-512 machine can test the code an AVX2 laptop runs.

``load()`` returns the op namespace (torch.ops.minillm_gguf) or raises
GGUFKernelUnavailable with the reason (no compiler, build error); callers fall
back to a slower path and say so.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterator

import torch

from minillm import envs

SOURCE = Path(__file__).with_name("gguf_matmul.cpp")
TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}  # ggml type ids
BLOCK = {2: (32, 18), 3: (32, 20), 6: (32, 22), 8: (32, 34), 12: (256, 144), 14: (256, 210),  # id -> (weights, bytes)
         1012: (256, 148),  # Q4_Kx8: our 8-row interleaved Q4_K (1184 bytes per 8 rows and super-block)
         1003: (32, 20),  # Q4_1x8: our 8-row interleaved Q4_1 (160 bytes per 8 rows and block of 32)
         1008: (32, 34),  # Q8_0x8: our 8-row interleaved Q8_0 (272 bytes per 8 rows and block of 32)
         1006: (32, 22)}  # Q5_0x8: our 8-row interleaved Q5_0 (176 bytes per 8 rows and block of 32)
Q4_KX8 = 1012
Q4_1X8 = 1003
Q8_0X8 = 1008
Q5_0X8 = 1006


class GGUFKernelUnavailable(RuntimeError):
    """The C++ kernels could not be built or loaded on this machine."""


def isa_flags(capability: str | None = None) -> tuple[str, list[str]]:
    """(label, compiler flags) for ATEN_CPU_CAPABILITY (unset: this CPU's own instruction set)."""
    cap = (capability if capability is not None else os.environ.get("ATEN_CPU_CAPABILITY", "")).lower()
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "native", ["-O3", "-mcpu=native"] if platform.machine().startswith("arm") else ["-O3"]
    if cap == "default":
        return "portable", ["-O3"]
    if cap == "avx2":  # what Zen 2/3 and Intel client CPUs without AVX-512 have
        return "avx2", ["-O3", "-mavx2", "-mfma", "-mf16c"]
    return "native", ["-O3", "-march=native"]


def cpuinfo_line(*keys: str) -> str | None:
    """The first /proc/cpuinfo line starting with one of `keys` (e.g. "flags", "vendor_id"), or None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(keys):
                return line
    except OSError:
        pass
    return None


def _cpu_flags() -> str:
    return cpuinfo_line("flags", "Features") or platform.processor()


def _cache_root() -> Path:
    root = envs.cache_dir()
    return Path(root) if root else Path.home() / ".cache" / "minillm"


STALE_LOCK_S = 600.0  # a build takes 10-60 s here; a lock this old belongs to a build that was killed


def clear_stale_lock(build_dir: Path, max_age_s: float = STALE_LOCK_S) -> bool:
    """Remove torch's build lock when it is older than max_age_s (its builder is gone): cpp_extension waits
    on it forever, and every later engine start would hang before its first step. Returns whether one was
    removed. (`owned_build` removes it at once where its owner is known to be gone.)"""
    import time
    import warnings

    lock = build_dir / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < max_age_s:
        return False  # another process may be building right now: wait for it, as cpp_extension does
    lock.unlink(missing_ok=True)
    warnings.warn(f"removed a stale build lock ({age:.0f} s old, a killed build?): {lock}", stacklevel=2)
    return True


@contextlib.contextmanager
def owned_build(build_dir: Path) -> Iterator[None]:
    """Hold this build folder's own lock while building: an flock, which the kernel drops when its process
    dies (Ctrl-C, a timeout, an out-of-memory kill). Every minillm build takes it before torch's file lock,
    so torch's lock found while we hold ours was left by a build that died: it is removed, with a warning,
    and this build goes on instead of waiting forever."""
    import warnings

    with open(build_dir / "minillm.lock", "w") as f:
        try:
            import fcntl
        except ImportError:  # not a POSIX platform: only the age rule
            clear_stale_lock(build_dir)
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)  # another process building the same kernel: wait for it
        try:
            lock = build_dir / "lock"
            if lock.exists():
                lock.unlink(missing_ok=True)
                warnings.warn(f"removed the build lock of a build that was killed: {lock}", stacklevel=4)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def announce(message: str) -> None:
    """One line on stderr: a first build makes the engine wait 10-60 s, and a user should know why."""
    print(f"minillm: {message}", file=sys.stderr, flush=True)


@functools.cache
def build_extension(source: Path, prefix: str, label: str, flags: tuple[str, ...]) -> Path:
    """Compile one C++ source that registers torch ops (once per source, flags, CPU and torch; cached on disk);
    returns the loaded library's path. A first build says so on stderr, with the time it took.

    Shared by the GGUF kernels and the CPU paged attention (kernels/paged_attention_cpu.py)."""
    import time

    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))  # what the sources may include
    key = hashlib.sha256(
        source.read_bytes() + headers + " ".join(flags).encode() + _cpu_flags().encode() + torch.__version__.encode()
    ).hexdigest()[:12]
    name = f"{prefix}_{label}_{key}"
    build_dir = _cache_root() / "kernels" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    library = build_dir / f"{name}.so"
    from torch.utils import cpp_extension

    with owned_build(build_dir):
        fresh = not library.exists()
        if fresh:
            announce(f"building the CPU fast path's {source.name} for this CPU ({label}), once per machine; "
                     f"cached in {build_dir.parent}")
        start = time.perf_counter()
        try:
            # ops register themselves in torch.ops.<namespace> when the library loads
            cpp_extension.load(name=name, sources=[str(source)], extra_cflags=list(flags),
                               extra_ldflags=["-fopenmp"], build_directory=str(build_dir), is_python_module=False,
                               verbose=False)
        except Exception as e:  # a missing compiler or ninja, a build error: report, never crash the engine
            raise GGUFKernelUnavailable(f"building {source.name} failed ({type(e).__name__}: {str(e)[-400:]})") from e
        if fresh:
            announce(f"built {source.name} in {time.perf_counter() - start:.1f} s")
    for old in build_dir.parent.glob(f"{prefix}_{label}_*"):  # builds of older sources: never loaded again
        if old != build_dir:
            shutil.rmtree(old, ignore_errors=True)
    return library


def build_and_load(source: Path, namespace: str, fakes: dict[str, Callable] | None = None,
                   c_functions: bool = False):
    """Build `source` for this CPU (ATEN_CPU_CAPABILITY's instruction set, OpenMP), load it, register each
    op's fake (shape-only) implementation for torch.compile once, and return torch.ops.<namespace>.
    c_functions: the library exports C functions for compiled graphs, so its symbols are shared
    (`share_symbols`); the others stay private to their library, as torch loads them.
    The build-and-load of the CPU float kernels and the paged attention; raises GGUFKernelUnavailable."""
    label, flags = isa_flags()
    library = build_extension(source, namespace, label, (*flags, "-fopenmp"))
    if c_functions:
        share_symbols(library)
    for op, fake in (fakes or {}).items():
        try:
            torch.library.register_fake(f"{namespace}::{op}")(fake)
        except (RuntimeError, AttributeError):  # already registered in this process
            pass
    return getattr(torch.ops, namespace)


def share_symbols(library: Path) -> None:
    """Make a loaded kernel library's C functions visible to libraries loaded after it (RTLD_GLOBAL; torch
    loads it RTLD_LOCAL): a compiled graph's C++ wrapper calls the few-row linear and the paged attention
    by their C names (engine/compile.py, direct_calls), and the dynamic linker resolves those names when
    the graph's library loads. Re-opening an already loaded library only changes its visibility."""
    import ctypes

    if not hasattr(os, "RTLD_NOLOAD"):  # not a dlopen platform (Windows): graphs use the dispatcher
        return
    try:
        ctypes.CDLL(str(library), mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
    except OSError:  # not loaded under that path: graphs then call the ops through the dispatcher
        pass


def loads_unless_turned_off(variable: str, off: str, load, fallback: str) -> bool:
    """False where the environment turns the kernel off (e.g. MINILLM_SKINNY=mkl), else loads_or_warns:
    the `available()` of the few-row, tiled and paged-attention kernels, whose callers fall back."""
    return not envs.turned_off(variable, off) and loads_or_warns(load, fallback)


def loads_or_warns(load, fallback: str) -> bool:
    """Call `load` (a kernel's build-and-load); True if it worked, else warn once what runs instead
    (`fallback`, e.g. "the torch path runs instead") with the reason, and False. Shared by the CPU
    paged attention and the few-row linear, whose callers fall back rather than fail."""
    try:
        load()
    except GGUFKernelUnavailable as e:
        import warnings

        warnings.warn(f"{fallback}: {e}", stacklevel=3)
        return False
    return True


def _build(label: str, flags: tuple[str, ...]):
    build_extension(SOURCE, "minillm_gguf", label, flags)
    return torch.ops.minillm_gguf


def load(capability: str | None = None):
    """torch.ops.minillm_gguf, built for ATEN_CPU_CAPABILITY (or `capability`), or GGUFKernelUnavailable.

    One process holds one build: the ops' names are global, so asking for a second
    capability after the first loaded is refused (run it in a subprocess).
    """
    label, flags = isa_flags(capability)
    flags = [*flags, "-fopenmp"]  # at::parallel_for is inline OpenMP: without it every op runs on one thread
    others = _LOADED - {label}
    if others:
        raise GGUFKernelUnavailable(f"this process already loaded the {others.pop()} build; start a new one for {label}")
    ops = _build(label, tuple(flags))
    if label not in _LOADED:
        _register_fakes()
        _LOADED.add(label)
    return ops


_LOADED: set[str] = set()


def loaded_isa() -> str | None:
    """The instruction set of the build this process loaded, or None (nothing loaded yet: never builds)."""
    return torch.ops.minillm_gguf.isa() if _LOADED else None


def available() -> tuple[bool, str]:
    """(True, the build's instruction set) or (False, why not)."""
    try:
        return True, load().isa()
    except GGUFKernelUnavailable as e:
        return False, str(e)


def activation_block(type_id: int) -> int:
    """Activations meet a weight type quantized in blocks of 256 (K-quants) or 32 (the rest)."""
    return BLOCK[type_id][0]


def row_bytes(type_id: int, in_features: int) -> int:
    per, nbytes = BLOCK[type_id]
    return in_features // per * nbytes


# Q4_K's 12 bytes of 6-bit scales and mins per super-block (the byte layout: minillm/quant/gguf.py), unpacked
# here for the repacked layout below and for the portable int4 mapping (quant/gguf.py)
def q4k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12 packed bytes [..., 12] -> 6-bit sc [..., 8] and m [..., 8] (llama.cpp get_scale_min_k4)."""
    a, b, c = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat((a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)), dim=-1)
    mn = torch.cat((b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)), dim=-1)
    return sc, mn


def q4k_pack_scale_min(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """The inverse of q4k_scale_min: 6-bit sc [..., 8] and m [..., 8] -> llama.cpp's 12 packed bytes."""
    return torch.cat([(sc[..., :4] & 0x3F) | ((sc[..., 4:] >> 4) << 6),
                      (mn[..., :4] & 0x3F) | ((mn[..., 4:] >> 4) << 6),
                      (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)], dim=-1)


def repack_q4k_x8(raw: torch.Tensor) -> torch.Tensor:
    """Q4_K rows uint8 [N, nb * 144] (N % 8 == 0) -> the Q4_KX8 layout of minillm/cpu/kernels/gguf_matmul.cpp, flat.

    The same codes and scales, rearranged so one 32-byte load holds 4 code bytes of each of 8 rows
    (the kernel then takes 8 rows' dot products in the lanes of one register, as llama.cpp's
    repacked Q4_K does): per group of 8 rows and super-block, d[8], dmin[8] (fp16), sc[8][8],
    m[8][8] (6-bit values in bytes, sub-block-major), codes [chunk 4][step 8][row 8][4 bytes].
    """
    n = raw.shape[0]
    if n % 8:
        raise ValueError(f"Q4_Kx8 needs a multiple of 8 rows, got {n}")
    blocks = raw.reshape(n // 8, 8, -1, 144).transpose(1, 2)  # [groups, nb, 8 rows, 144]
    g, nb = blocks.shape[:2]
    sc, mn = q4k_scale_min(blocks[..., 4:16])  # [g, nb, 8 rows, 8 sub-blocks]
    codes = blocks[..., 16:].reshape(g, nb, 8, 4, 8, 4).permute(0, 1, 3, 4, 2, 5)  # [g, nb, c, t, row, 4]
    parts = (blocks[..., 0:2], blocks[..., 2:4], sc.transpose(2, 3), mn.transpose(2, 3), codes)
    return torch.cat([p.reshape(g, nb, -1) for p in parts], dim=-1).reshape(-1).contiguous()


def unpack_q4k_x8(packed: torch.Tensor, rows: int, in_features: int) -> torch.Tensor:
    """The inverse of repack_q4k_x8: the file's Q4_K rows uint8 [rows, nb * 144]."""
    g, nb = rows // 8, in_features // 256
    x = packed.reshape(g, nb, 1184)
    d, dmin = x[..., 0:16].reshape(g, nb, 8, 2), x[..., 16:32].reshape(g, nb, 8, 2)
    sc, mn = x[..., 32:96].reshape(g, nb, 8, 8).transpose(2, 3), x[..., 96:160].reshape(g, nb, 8, 8).transpose(2, 3)
    codes = x[..., 160:].reshape(g, nb, 4, 8, 8, 4).permute(0, 1, 4, 2, 3, 5).reshape(g, nb, 8, 128)
    blocks = torch.cat([d, dmin, q4k_pack_scale_min(sc, mn), codes], dim=-1)  # [g, nb, 8, 144]
    return blocks.transpose(1, 2).reshape(rows, nb * 144).contiguous()


def repack_q4_1_x8(raw: torch.Tensor, type_name: str = "Q4_1") -> torch.Tensor:
    """Q4_1 (or Q4_0) rows uint8 [N, nb * 20 (18)] (N % 8 == 0) -> the Q4_1X8 layout of
    minillm/cpu/kernels/gguf_matmul.cpp, flat: per group of 8 rows and block of 32, d[8], m[8] (fp16), then the
    codes as [step 4][row 8][4 bytes], so one 32-byte load holds 4 code bytes of each of 8 rows.

    Q4_0's w = d (q - 8) becomes Q4_1's w = d q + m with m = -8 d, exact in fp16 (a power-of-two
    multiple), so both file types share one kernel."""
    n = raw.shape[0]
    if n % 8:
        raise ValueError(f"Q4_1x8 needs a multiple of 8 rows, got {n}")
    per = {"Q4_1": 20, "Q4_0": 18}[type_name]
    blocks = raw.reshape(n // 8, 8, -1, per).transpose(1, 2)  # [groups, nb, 8 rows, per]
    g, nb = blocks.shape[:2]
    d = blocks[..., 0:2].contiguous()
    if type_name == "Q4_1":
        m, codes = blocks[..., 2:4].contiguous(), blocks[..., 4:20]
    else:
        m = (d.view(torch.float16) * -8).view(torch.uint8)
        codes = blocks[..., 2:18]
    codes = codes.reshape(g, nb, 8, 4, 4).transpose(2, 3)  # [g, nb, step, row, 4]
    parts = (d, m, codes)
    return torch.cat([p.reshape(g, nb, -1) for p in parts], dim=-1).reshape(-1).contiguous()


def unpack_q4_1_x8(packed: torch.Tensor, rows: int, in_features: int) -> torch.Tensor:
    """The inverse of repack_q4_1_x8, as Q4_1 rows uint8 [rows, nb * 20] (a Q4_0 source comes back as
    the equal Q4_1 blocks)."""
    g, nb = rows // 8, in_features // 32
    x = packed.reshape(g, nb, 160)
    d, m = x[..., 0:16].reshape(g, nb, 8, 2), x[..., 16:32].reshape(g, nb, 8, 2)
    codes = x[..., 32:].reshape(g, nb, 4, 8, 4).transpose(2, 3).reshape(g, nb, 8, 16)
    blocks = torch.cat([d, m, codes], dim=-1)  # [g, nb, 8, 20]
    return blocks.transpose(1, 2).reshape(rows, nb * 20).contiguous()


def repack_q8_0_x8(raw: torch.Tensor) -> torch.Tensor:
    """Q8_0 rows uint8 [N, nb * 34] (N % 8 == 0) -> the Q8_0X8 layout, flat: per group of 8 rows and
    block of 32, d[8] (fp16), then the codes as [step 8][row 8][4 bytes]."""
    n = raw.shape[0]
    if n % 8:
        raise ValueError(f"Q8_0x8 needs a multiple of 8 rows, got {n}")
    blocks = raw.reshape(n // 8, 8, -1, 34).transpose(1, 2)  # [groups, nb, 8 rows, 34]
    g, nb = blocks.shape[:2]
    codes = blocks[..., 2:34].reshape(g, nb, 8, 8, 4).transpose(2, 3)  # [g, nb, step, row, 4]
    return torch.cat([blocks[..., 0:2].reshape(g, nb, 16), codes.reshape(g, nb, 256)], dim=-1).reshape(-1).contiguous()


def unpack_q8_0_x8(packed: torch.Tensor, rows: int, in_features: int) -> torch.Tensor:
    """The inverse of repack_q8_0_x8: the file's Q8_0 rows uint8 [rows, nb * 34]."""
    g, nb = rows // 8, in_features // 32
    x = packed.reshape(g, nb, 272)
    d = x[..., 0:16].reshape(g, nb, 8, 2)
    codes = x[..., 16:].reshape(g, nb, 8, 8, 4).transpose(2, 3).reshape(g, nb, 8, 32)
    return torch.cat([d, codes], dim=-1).transpose(1, 2).reshape(rows, nb * 34).contiguous()


_BIT = 2 ** torch.arange(32, dtype=torch.int64)


def _qh_step_order(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0's high-bit words (uint8 [..., 4], bit j = element j) -> 4 bytes where byte s holds elements
    4s..4s+3 in its low nibble and 16+4s..16+4s+3 in its high nibble (the order the kernel's steps read)."""
    word = (qh.to(torch.int64) << torch.tensor([0, 8, 16, 24])).sum(-1)
    bits = (word[..., None] >> torch.arange(32)) & 1  # [..., 32]
    lo, hi = bits[..., :16].reshape(*bits.shape[:-1], 4, 4), bits[..., 16:].reshape(*bits.shape[:-1], 4, 4)
    return ((lo << torch.arange(4)).sum(-1) | (hi << torch.arange(4, 8)).sum(-1)).to(torch.uint8)


def _qh_file_order(steps: torch.Tensor) -> torch.Tensor:
    """The inverse of _qh_step_order: 4 step bytes -> the file's high-bit word as uint8 [..., 4]."""
    b = steps.to(torch.int64)
    lo = ((b[..., None] >> torch.arange(4)) & 1).reshape(*b.shape[:-1], 16)
    hi = ((b[..., None] >> torch.arange(4, 8)) & 1).reshape(*b.shape[:-1], 16)
    word = (torch.cat([lo, hi], -1) * _BIT).sum(-1)
    return ((word[..., None] >> torch.tensor([0, 8, 16, 24])) & 0xFF).to(torch.uint8)


def repack_q5_0_x8(raw: torch.Tensor) -> torch.Tensor:
    """Q5_0 rows uint8 [N, nb * 22] (N % 8 == 0) -> the Q5_0X8 layout, flat: per group of 8 rows and block
    of 32, d[8] (fp16), the high bits as 8 words in step order (_qh_step_order), then the codes as
    [step 4][row 8][4 bytes] (Q4_1X8's order)."""
    n = raw.shape[0]
    if n % 8:
        raise ValueError(f"Q5_0x8 needs a multiple of 8 rows, got {n}")
    blocks = raw.reshape(n // 8, 8, -1, 22).transpose(1, 2)  # [groups, nb, 8 rows, 22]
    g, nb = blocks.shape[:2]
    hb = _qh_step_order(blocks[..., 2:6])  # [g, nb, 8, 4]
    codes = blocks[..., 6:22].reshape(g, nb, 8, 4, 4).transpose(2, 3)  # [g, nb, step, row, 4]
    parts = (blocks[..., 0:2], hb, codes)
    return torch.cat([p.reshape(g, nb, -1) for p in parts], dim=-1).reshape(-1).contiguous()


def unpack_q5_0_x8(packed: torch.Tensor, rows: int, in_features: int) -> torch.Tensor:
    """The inverse of repack_q5_0_x8: the file's Q5_0 rows uint8 [rows, nb * 22]."""
    g, nb = rows // 8, in_features // 32
    x = packed.reshape(g, nb, 176)
    d, hb = x[..., 0:16].reshape(g, nb, 8, 2), _qh_file_order(x[..., 16:48].reshape(g, nb, 8, 4))
    codes = x[..., 48:].reshape(g, nb, 4, 8, 4).transpose(2, 3).reshape(g, nb, 8, 16)
    return torch.cat([d, hb, codes], dim=-1).transpose(1, 2).reshape(rows, nb * 22).contiguous()


def interleave(type_name: str, raw: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """A file type's rows [N, row bytes] in our 8-row layout and its kernel type id, or None where
    the row-by-row kernel stays (Q6_K: the same scheme measured 14.4 vs 26.0 GB/s; N % 8 != 0)."""
    if raw.shape[0] % 8:
        return None
    if type_name == "Q4_K":
        return repack_q4k_x8(raw), Q4_KX8
    if type_name in ("Q4_1", "Q4_0"):
        return repack_q4_1_x8(raw, type_name), Q4_1X8
    if type_name == "Q8_0":
        return repack_q8_0_x8(raw), Q8_0X8
    if type_name == "Q5_0":
        return repack_q5_0_x8(raw), Q5_0X8
    return None


def deinterleave(type_id: int, packed: torch.Tensor, rows: int, in_features: int) -> tuple[torch.Tensor, int]:
    """(file-layout bytes, file type id) of a layer part; a file type passes through. Q4_1x8 comes back
    as Q4_1 blocks, whether the file held Q4_1 or Q4_0."""
    if type_id == Q4_KX8:
        return unpack_q4k_x8(packed, rows, in_features).reshape(-1), TYPE_IDS["Q4_K"]
    if type_id == Q4_1X8:
        return unpack_q4_1_x8(packed, rows, in_features).reshape(-1), TYPE_IDS["Q4_1"]
    if type_id == Q5_0X8:
        return unpack_q5_0_x8(packed, rows, in_features).reshape(-1), TYPE_IDS["Q5_0"]
    if type_id == Q8_0X8:
        return unpack_q8_0_x8(packed, rows, in_features).reshape(-1), TYPE_IDS["Q8_0"]
    return packed, type_id


# torch.compile traces through fake tensors: declare each op's output shapes
def _register_fakes() -> None:
    try:
        lib = torch.library

        @lib.register_fake("minillm_gguf::quantize_act")
        def _(x, block):
            m, k = x.shape
            return (x.new_empty((m, k), dtype=torch.int8), x.new_empty((m, k // block), dtype=torch.float32),
                    x.new_empty((m, k // 16), dtype=torch.int16), x.new_empty((m, k // 32), dtype=torch.float32))

        @lib.register_fake("minillm_gguf::qmatmul")
        def _(q, xd, bs, xs, w, qtype, n, portable=False):
            return xd.new_empty((q.shape[0], n))

        @lib.register_fake("minillm_gguf::linear")
        def _(x, blocks, qtypes, bias=None):
            k = x.shape[1]
            n = sum(b.numel() // row_bytes(t, k) for b, t in zip(blocks, qtypes))
            return x.new_empty((x.shape[0], n), dtype=torch.float32)

        @lib.register_fake("minillm_gguf::dequantize")
        def _(w, qtype, n, k):
            return w.new_empty((n, k), dtype=torch.float32)
    except (RuntimeError, AttributeError):  # already registered in this process, or an older torch
        pass
