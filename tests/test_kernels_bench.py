"""Smoke test of the GPU bench's report functions on CPU: tiny shapes, a wall-clock
stand-in for triton.testing.do_bench (which needs CUDA), fake roofs. This keeps the
GPU-only code paths importable and free of Python errors; the numbers mean nothing."""
import os
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import triton.testing  # noqa: E402

from minillm.kernels import bench, kv_store, paged_decode, prefill  # noqa: E402

ROOFS = {"copy_GBps": 10.0, "matmul_TFLOPs": 1.0}


@pytest.fixture
def cpu_do_bench(monkeypatch):
    def do_bench(fn, *args, **kwargs):
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the real bench runs on the GPU")
def test_perf_reports_run_on_cpu(cpu_do_bench):
    reps = [
        kv_store.perf_report(num_tokens=64, kv_heads=2, head_dim=32, roofs=ROOFS, device="cpu"),
        paged_decode.perf_report(batch=2, ctx=40, heads=4, kv_heads=2, head_dim=32, roofs=ROOFS,
                                 device="cpu", num_splits=2),
        prefill.perf_report(seq_len=40, heads=4, kv_heads=2, head_dim=32, roofs=ROOFS, device="cpu"),
    ]
    for r in reps:
        assert r["ok"] and r["ms"] > 0, r
    assert reps[1]["frac_of_copy_bw"] > 0 and reps[2]["frac_of_sdpa"] > 0


def test_bench_main_without_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("runs the full GPU bench")
    assert bench.main([]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the real bench runs on the GPU")
def test_fused_perf_reports_run_on_cpu(cpu_do_bench):
    from minillm.kernels import rmsnorm, rope

    for r in (rmsnorm.perf_report(tokens=16, hidden=64, roofs=ROOFS, device="cpu"),
              rope.perf_report(tokens=16, heads=2, head_dim=16, roofs=ROOFS, device="cpu")):
        assert r["ok"] and r["frac_of_copy_bw"] > 0, r
