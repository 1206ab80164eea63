"""The teaching core and the CPU fast path (engine/fast_path.py, minillm/cpu/).

- fast_path="off" runs the plain PyTorch code alone: in a fresh process on the default model, no
  project extension is mapped (/proc/self/maps), no module of the fast path is imported, the
  project files executed stay within the reading budget, and the greedy tokens equal transformers'.
- The plain path and the fast path give the same greedy tokens (default model; Qwen2.5-Coder-1.5B).
- The trace names the path that ran each step; the engine reports its fast path and start-up choices.
- "require" fails with a reason where no fast path can run; a broken plug-in leaves the plain path.
- The core names no fast path, and the lab is never imported by it.
- A build killed mid-way leaves no lock that makes the next process wait.
"""
from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minillm.engine import fast_path as fp
from minillm.engine.config import EngineConfig
from minillm.sampling_params import SamplingParams
from tests.helpers.engine_utils import greedy, make_engine, run_to_completion, tiny_model

ROOT = Path(__file__).resolve().parent.parent
MAX_FILES, MAX_LINES = 40, 6000  # the reading path's budget: what one plain run executes, imports included
PROMPT = "The capital of France is"
NEW_TOKENS = 16

PLAIN_RUN = r'''
import json, os, sys
root = os.path.abspath("minillm"), os.path.abspath("kernels"), os.path.abspath("visualize")
executed = set()

def tracer(frame, event, arg):
    if frame.f_code.co_filename.startswith(root):
        executed.add(frame.f_code.co_filename)

sys.setprofile(tracer)  # every call into project code, module bodies (imports) included
from minillm import LLM, SamplingParams
llm = LLM(fast_path="off")
out = llm.generate([sys.argv[1]], SamplingParams(temperature=0, max_tokens=int(sys.argv[2])), use_tqdm=False)[0]
sys.setprofile(None)
maps = open("/proc/self/maps").read().split("\n")
print(json.dumps({
    "tokens": out.outputs[0].token_ids, "prompt_ids": out.prompt_token_ids,
    "paths": sorted({t.path for t in llm.trace if t.path}),
    "fast_modules": sorted(m for m in sys.modules if m.startswith("minillm.cpu")),
    "extensions": sorted({line.split()[-1] for line in maps if line.endswith(".so") and "minillm" in line}),
    "files": sorted(os.path.relpath(f) for f in executed),
}))
'''


@pytest.fixture(scope="module")
def plain_run() -> dict:
    out = subprocess.run([sys.executable, "-c", PLAIN_RUN, PROMPT, str(NEW_TOKENS)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.mark.slow
@pytest.mark.default_model
def test_the_plain_path_runs_plain_code_only(plain_run):
    assert plain_run["paths"] == ["plain"]
    assert plain_run["fast_modules"] == [], "fast_path='off' imported the fast path"
    assert plain_run["extensions"] == [], "fast_path='off' mapped a compiled extension of the project"


@pytest.mark.slow
@pytest.mark.default_model
def test_the_plain_run_reads_within_an_afternoons_budget(plain_run):
    files = plain_run["files"]
    lines = sum(len((ROOT / f).read_text().splitlines()) for f in files)
    assert not [f for f in files if f.startswith(("minillm/cpu", "kernels/"))]
    assert len(files) <= MAX_FILES and lines <= MAX_LINES, f"{len(files)} files, {lines} lines: {files}"


@pytest.mark.slow
@pytest.mark.default_model
def test_the_plain_path_gives_transformers_greedy_tokens(plain_run, hf_default_reference):
    """Up to a near-tie: where the paths part, transformers' own top-2 logit gap must be below 1e-3."""
    ids = plain_run["prompt_ids"]
    with torch.no_grad():
        out = hf_default_reference.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                            max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                            return_dict_in_generate=True, pad_token_id=0)
    theirs = out.sequences[0, len(ids):].tolist()
    mine = plain_run["tokens"]
    k = first_difference(mine, theirs)
    if k is not None:
        top2 = torch.stack(out.logits)[k, 0].float().topk(2).values
        assert float(top2[0] - top2[1]) < 1e-3, f"token {k}: {mine[k]} vs transformers' {theirs[k]}"
    else:
        assert len(mine) == len(theirs) or mine[-1] in hf_default_reference.generation_config.eos_token_id


def both_paths(name: str | None, prompts: list[str], **kw) -> tuple[list[list[int]], list[list[int]], list, list]:
    from minillm import LLM

    greedy_params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    out = []
    for mode in ("off", "auto"):  # separate loads: the fast path changes its model in place
        llm = LLM(name, fast_path=mode, **kw)
        try:
            tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy_params, use_tqdm=False)]
            out += [tokens, sorted({t.path for t in llm.trace if t.path})]
        finally:
            llm.close()
    return out[0], out[2], out[1], out[3]


@pytest.mark.slow
@pytest.mark.default_model
def test_plain_and_fast_paths_give_the_same_greedy_tokens_on_the_default_model():
    plain, fast, plain_paths, fast_paths = both_paths(None, [PROMPT, "def fib(n):", "Once upon a time"])
    assert plain == fast
    assert plain_paths == ["plain"] and "one-region CPU step" in fast_paths


@pytest.mark.slow
@pytest.mark.real_model
def test_plain_and_fast_paths_give_the_same_greedy_tokens_on_qwen_1_5b():
    from minillm.loader import registry

    if not registry.is_installed("qwen2.5-coder-1.5b"):
        pytest.skip("qwen2.5-coder-1.5b is not installed (the models extra)")
    plain, fast, _, fast_paths = both_paths("qwen2.5-coder-1.5b", ["def quicksort(arr):\n    "],
                                            dtype="float32", num_kv_blocks=16, max_model_len=256)
    assert plain == fast and fast_paths


# ----- the interface and its report -----------------------------------------------------------------


def test_fast_path_modes_are_validated():
    with pytest.raises(ValueError, match="fast_path must be one of"):
        EngineConfig(fast_path="fast")
    with pytest.raises(ValueError, match="cpu_decode_step=True"):
        EngineConfig(fast_path="off", cpu_decode_step=True)


def test_off_reports_no_fast_path_and_the_trace_says_plain():
    model = tiny_model()
    engine = make_engine(model, fast_path="off")
    assert engine.executor.fast_path is None and engine.executor.fast_path_report.to_dict()["name"] is None
    engine.add_request("a", [5, 6, 7, 8], greedy(4))
    run_to_completion(engine)
    assert {t.path for t in engine.trace} == {"plain"}


def test_auto_runs_the_cpu_fast_path_and_reports_its_choices():
    model = tiny_model()
    plain = make_engine(tiny_model(), fast_path="off")  # a copy with the same weights (seeded)
    engine = make_engine(model, fast_path="auto")
    report = engine.executor.fast_path_report.to_dict()
    assert report["name"] == "cpu" and report["mode"] == "auto"
    assert {"malloc", "fused_layers", "huge_pages", "panels"} <= set(report["choices"])
    for e in (plain, engine):
        e.add_request("a", [5, 6, 7, 8, 9], greedy(6))
    assert run_to_completion(plain) == run_to_completion(engine)
    assert {t.path for t in plain.trace} == {"plain"}
    assert all(t.path for t in engine.trace)
    json.dumps(report)  # the bench JSON carries it


def test_require_names_why_no_fast_path_can_run(monkeypatch):
    monkeypatch.setattr(fp, "installed_fast_paths", lambda: [])
    with pytest.raises(fp.FastPathUnavailable, match="no fast path is installed"):
        make_engine(tiny_model(), fast_path="require")
    engine = make_engine(tiny_model(), fast_path="auto")  # auto: the plain path, and the report says why
    assert engine.executor.fast_path is None
    assert "no fast path is installed" in engine.executor.fast_path_report.why_not


def test_require_runs_the_cpu_fast_path_where_it_applies():
    assert make_engine(tiny_model(), fast_path="require").executor.fast_path.name == "cpu"


def test_a_broken_plug_in_warns_and_leaves_the_plain_path(monkeypatch):
    class Broken:
        name = "broken"

        def load(self):
            raise ImportError("no such module")

    monkeypatch.setattr(fp, "entry_points", lambda group: [Broken()])
    with pytest.warns(RuntimeWarning, match="fast path 'broken' could not be loaded"):
        engine = make_engine(tiny_model(), fast_path="auto")
    assert engine.executor.fast_path is None


def test_a_fast_path_that_does_not_apply_says_why(monkeypatch):
    class NotHere(fp.FastPath):
        name = "elsewhere"

        def why_not(self, model, config, device):
            return "needs another machine"

    monkeypatch.setattr(fp, "installed_fast_paths", lambda: [NotHere()])
    with pytest.raises(fp.FastPathUnavailable, match="elsewhere: needs another machine"):
        make_engine(tiny_model(), fast_path="require")


# ----- structure ---------------------------------------------------------------------------------------

CORE = ["minillm/engine", "minillm/models", "minillm/attention", "minillm/loader", "minillm/llm.py",
        "minillm/sampling_params.py", "minillm/config.py", "minillm/envs.py", "minillm/__init__.py"]
FAST_PATH = ("minillm.cpu",)
LAB = ("minillm.bench", "minillm.roofline", "minillm.eval", "minillm.metrics", "minillm.visualize")


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name a file imports, inside functions too."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def core_files() -> list[Path]:
    out = []
    for entry in CORE:
        p = ROOT / entry
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def test_the_core_names_no_fast_path_and_imports_no_lab():
    bad = {}
    for f in core_files():
        hits = [n for n in imported_modules(f) if any(n == p or n.startswith(p + ".") for p in FAST_PATH + LAB)]
        if hits:
            bad[str(f.relative_to(ROOT))] = sorted(hits)
    assert not bad, bad


def test_the_structure_check_can_fail(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from minillm.cpu import CpuFastPath\n    import minillm.bench.cli\n")
    names = imported_modules(f)
    assert "minillm.cpu" in names and "minillm.bench.cli" in names


# ----- building the kernels safely ----------------------------------------------------------------------

KILLED_BUILD = r'''
import sys, time
from pathlib import Path
from minillm.cpu.kernels.gguf_cpu import owned_build
d = Path(sys.argv[1])
with owned_build(d):
    (d / "lock").write_text("")  # torch's lock, as cpp_extension leaves it mid-build
    print("building", flush=True)
    time.sleep(60)
'''


def test_a_build_killed_mid_way_leaves_no_lock_that_blocks_the_next(tmp_path):
    from minillm.cpu.kernels.gguf_cpu import owned_build

    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "building"
    proc.send_signal(signal.SIGKILL)  # as an out-of-memory kill or a timeout would
    proc.wait(timeout=30)
    assert (tmp_path / "lock").exists()
    start = time.perf_counter()
    with pytest.warns(UserWarning, match="build lock of a build that was killed"):
        with owned_build(tmp_path):
            assert not (tmp_path / "lock").exists()
    assert time.perf_counter() - start < 10  # no wait for a builder that is gone
