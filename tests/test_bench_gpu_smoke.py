"""The prepared GPU check (minillm/bench/gpu.py) runs end to end here at toy sizes, so a GPU loan is not spent on a crash."""
import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def test_gpu_script_smoke_run_writes_every_section(tmp_path):
    pytest.importorskip("transformers")
    from minillm.bench import gpu

    out = tmp_path / "gpu.json"
    assert gpu.main(["--smoke", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["all_kernel_checks_ok"] and rep["machine"]["torch"] == torch.__version__
    kernels = {r["kernel"] for r in rep["kernel_checks"]}
    assert {"paged_decode", "prefill", "store_kv_cache", "w8a16_matmul", "w4a16_matmul"} <= kernels
    assert any("int8 KV" in r["dtype"] for r in rep["kernel_checks"])
    assert all(0 < r["tol"] < 1 for r in rep["kernel_checks"])
    e = rep["engine"]["smoke"]
    # the same random weights in both systems: float32 greedy tokens agree
    assert e["greedy_agreement"]["dtype"] == "torch.float32"
    assert e["greedy_agreement"]["triton_vs_torch"]["identical"] == 1.0
    assert e["greedy_agreement"]["torch_vs_transformers"]["identical"] == 1.0
    assert e["throughput"]["minillm_output_tok_per_s"] > 0 and e["throughput"]["transformers_output_tok_per_s"] > 0
    assert e["batch1_eager"]["tok_per_s"] > 0 and rep["failures"] == []


def test_a_failing_part_keeps_the_others_and_the_json_is_written_after_each(tmp_path, monkeypatch):
    """A short GPU loan must not lose every figure to one crash: the part records its error, the rest run."""
    from minillm.bench import gpu

    out = tmp_path / "gpu.json"
    seen_on_disk = []
    real = gpu.run_section

    def spy(target, key, fn, deadline, save):
        real(target, key, fn, deadline, save)
        seen_on_disk.append(key in json.dumps(json.loads(out.read_text())))

    def broken(*a, **k):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(gpu, "run_section", spy)
    monkeypatch.setattr(gpu, "kernel_checks", broken)
    monkeypatch.setattr(gpu, "SMOKE_SHAPE", {**gpu.SMOKE_SHAPE, "num_hidden_layers": 1})
    assert gpu.main(["--smoke", "--json", str(out)]) == 1
    rep = json.loads(out.read_text())
    assert "planted failure" in rep["kernel_checks"]["error"] and "Traceback" in rep["kernel_checks"]["traceback"]
    assert rep["engine"]["smoke"]["throughput"]["minillm_output_tok_per_s"] > 0  # the engine part still ran
    assert any("kernel_checks: error: RuntimeError: planted failure" in f for f in rep["failures"])
    assert not rep["all_kernel_checks_ok"] and seen_on_disk and all(seen_on_disk)


def test_past_the_budget_parts_are_skipped_and_reported(tmp_path):
    from minillm.bench import gpu

    out = tmp_path / "gpu.json"
    assert gpu.main(["--smoke", "--budget-s", "0", "--json", str(out)]) == 1
    rep = json.loads(out.read_text())
    assert rep["kernel_checks"] == {"skipped": "out of time (--budget-s)"}
    assert "skipped" in rep["engine"]["smoke"]
    assert {f.split(":")[0] for f in rep["failures"]} == {"kernel_checks", "engine.smoke"}


def test_gpu_script_refuses_a_full_run_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    from minillm.bench import gpu

    assert gpu.main(["--json", "/dev/null"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_kv_budget_leaves_room_for_weights_and_activations():
    from minillm.engine.kv_cache import gpu_kv_budget_bytes

    gib = 2**30
    # 140 GiB device, 0.9 of it, 3 GiB in use (weights, context), a 2 GiB activation peak
    assert gpu_kv_budget_bytes(140 * gib, 137 * gib, 0.9, 2 * gib) == int(140 * gib * 0.9) - 3 * gib - 2 * gib
    with pytest.raises(ValueError, match="no room for a KV cache"):
        gpu_kv_budget_bytes(16 * gib, 2 * gib, 0.9, 1 * gib)


def test_bf16_ulps_is_the_spacing_of_bf16_at_the_largest_output():
    from minillm.bench.gpu import bf16_ulps

    ref = torch.tensor([-5.0, 1.0])
    next_bf16 = torch.tensor(5.0 + 2**-5, dtype=torch.bfloat16).float().item()  # representable: one ulp above 5
    assert next_bf16 - 5.0 == bf16_ulps(ref, 1) and bf16_ulps(ref, 2) == 2**-4
    assert torch.tensor(5.0 + 2**-7, dtype=torch.bfloat16).float().item() == 5.0  # a quarter ulp rounds away
    assert bf16_ulps(torch.zeros(3), 2) == 0.0
