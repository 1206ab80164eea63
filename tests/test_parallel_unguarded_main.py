"""A script that builds `LLM(tensor_parallel_size=2)` at its top level, with no `if __name__ == "__main__":`.

Under multiprocessing's "spawn" every worker runs the main script's top level again, reaches
LLM(...) once more and dies in multiprocessing's bootstrapping RuntimeError; the engine then
failed with "worker exited while loading the model". Workers are now forked where that is
safe (Linux, CUDA not initialised, as vLLM does), so the script just works; under spawn
(CUDA initialised, or forced here) it fails at once with an error that says to add the guard.

Fork is only safe once this process's OpenMP thread pool is released (executor.py,
_release_openmp_pool): the scripts run 2-thread matmuls before the LLM and give each worker
2 threads, the case in which a forked child used to hang in its first parallel region.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minillm import LLM, SamplingParams
from tests.helpers.tiny_models import make_tiny_hf_model

pytestmark = pytest.mark.slow  # two scripts, each loads torch and the tiny model in 2 processes (~15 s of CPU)

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[1, 2, 3, 4, 5], list(range(10, 30))]
ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16)
SCRIPT = """\
import json, sys

import torch

from minillm import LLM, SamplingParams

if sys.argv[2] != "auto":
    import minillm.parallel.executor

    minillm.parallel.executor.START_METHOD = sys.argv[2]

torch.set_num_threads(2)
x = torch.randn(1024, 1024)
for _ in range(4):  # OpenMP parallel regions on 2 threads in this process before any worker starts
    x = torch.tanh(x @ x)

llm = LLM(sys.argv[1], tensor_parallel_size=2, worker_threads=2, distributed_timeout_s=30,
          distributed_startup_timeout_s=120, **{ENGINE!r})
sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
outs = llm.generate({PROMPTS!r}, sp, use_tqdm=False)
print("START_METHOD", llm.engine.executor.start_method)
print("TOKENS", json.dumps([o.outputs[0].token_ids for o in outs]))
llm.close()
""".format(ENGINE=ENGINE, PROMPTS=PROMPTS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unguarded")
    folder, _ = make_tiny_hf_model(tmp, "llama", num_attention_heads=8, num_key_value_heads=4)
    script = tmp / "generate_tp2.py"  # no `if __name__ == "__main__":` anywhere
    script.write_text(SCRIPT)
    return str(folder), script


def run_script(script: Path, folder: str, method: str, timeout_s: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(script), folder, method], cwd=script.parent, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    return proc, time.monotonic() - t0


def test_an_unguarded_script_runs_with_forked_workers(tiny):
    folder, script = tiny
    proc, _ = run_script(script, folder, "auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("TOKENS", "START")))
    assert lines["START_METHOD"] == "fork"
    with LLM(folder, **ENGINE) as one:
        ref = [o.outputs[0].token_ids for o in
               one.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)]
    assert json.loads(lines["TOKENS"]) == ref


def test_an_unguarded_script_under_spawn_fails_at_once_with_the_fix(tiny):
    """What CUDA-initialised processes get (spawn): a clear error, not multiprocessing's bootstrapping one."""
    folder, script = tiny
    proc, elapsed = run_script(script, folder, "spawn")
    assert proc.returncode != 0
    err = proc.stderr
    assert "TensorParallelError" in err and 'if __name__ == "__main__":' in err, err[-3000:]
    assert "bootstrapping phase" not in err  # stopped before multiprocessing's own error
    assert elapsed < 120  # at once: not after distributed_startup_timeout_s


def test_fork_is_safe_after_openmp_once_the_pool_is_released(tmp_path):
    """The measurement behind fork: a child forked after a 2-thread parallel region, itself on 2 threads."""
    probe = tmp_path / "probe.py"
    probe.write_text("""\
import multiprocessing as mp, os, torch
from minillm.parallel.executor import _release_openmp_pool

def child(q):
    torch.set_num_threads(2)
    before = len(os.listdir("/proc/self/task"))
    torch.randn(1024, 1024) @ torch.randn(1024, 1024)  # MKL GEMM, OpenMP
    torch.exp(torch.randn(4_000_000))  # an ATen parallel_for
    q.put((torch.get_num_threads(), len(os.listdir("/proc/self/task")) - before))

if __name__ == "__main__":
    torch.set_num_threads(2)
    torch.randn(1024, 1024) @ torch.randn(1024, 1024)
    assert _release_openmp_pool()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,), daemon=True)
    p.start()
    print("CHILD", *q.get(timeout=60))
    p.join()
    torch.randn(1024, 1024) @ torch.randn(1024, 1024)  # this process goes on with a new pool
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    threads, started = proc.stdout.split("CHILD")[1].split()
    assert threads == "2" and int(started) >= 1  # the child ran its regions on a pool of its own
