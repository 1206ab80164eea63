"""Every engine step on the roofline, from the trace alone: intensity, achieved rates, fraction of the roof.

A real trace of a tiny random model: the analytic FLOPs/bytes are the
engine's, the durations are measured. What can fail: the derived figures must
equal their definitions, survive a JSONL round trip, and the roofs decide
which side of the ridge a step is on.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from minillm.engine.trace import dump_trace, load_trace
from minillm.metrics.from_trace import summarize
from minillm.roofline.steps import RoofPair, roofline_summary, step_phase, step_roofline, trace_roofline
from tests.helpers.engine_utils import greedy, make_engine, random_prompts, run_to_completion, tiny_model


@pytest.fixture(scope="module")
def trace():
    engine = make_engine(tiny_model(), max_num_batched_tokens=64)
    for i, p in enumerate(random_prompts(3, 97, 20, 30, seed=3)):
        engine.add_request(str(i), p, greedy(6))
    run_to_completion(engine)
    return list(engine.trace)


def test_trace_steps_carry_intensity_and_achieved_rates(trace, tmp_path):
    computing = [r for r in trace if r.flops > 0]
    assert computing and all(r.duration_s > 0 and r.bytes_moved > 0 for r in computing)
    for r in computing:
        assert r.arithmetic_intensity == pytest.approx(r.flops / r.bytes_moved)
        assert r.achieved_flops_per_s == pytest.approx(r.flops / r.duration_s)
        assert r.achieved_bytes_per_s == pytest.approx(r.bytes_moved / r.duration_s)
    path = tmp_path / "t.jsonl"
    dump_trace(trace, str(path))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["achieved_flops_per_s"] == pytest.approx(trace[0].achieved_flops_per_s)
    assert lines[0]["arithmetic_intensity"] == pytest.approx(trace[0].arithmetic_intensity)
    again = load_trace(str(path))  # the derived keys are ignored on load and recomputed
    assert [r.achieved_bytes_per_s for r in again] == [r.achieved_bytes_per_s for r in trace]


def test_step_roofline_matches_its_definitions(trace):
    roofs = RoofPair(bandwidth_bytes_per_s=20e9, peak_flops_per_s=100e9)  # ridge at 5 FLOP/B
    assert roofs.ridge_intensity == pytest.approx(5.0)
    rows = trace_roofline(trace, roofs)
    assert rows and all(r.phase != "idle" for r in rows)
    for row, rec in zip(rows, [r for r in trace if step_phase(r) != "idle"]):
        assert row.step == rec.step and row.intensity == pytest.approx(rec.arithmetic_intensity)
        attainable = min(100e9, 20e9 * row.intensity)
        assert row.attainable_flops_per_s == pytest.approx(attainable)
        assert row.roof_fraction == pytest.approx(rec.achieved_flops_per_s / attainable)
        assert row.bandwidth_fraction == pytest.approx(rec.achieved_bytes_per_s / 20e9)
        assert row.compute_fraction == pytest.approx(rec.achieved_flops_per_s / 100e9)
        assert row.bound == ("memory" if row.intensity < 5.0 else "compute")
    phases = {r.phase for r in rows}
    assert {"prefill", "decode"} <= phases
    # a prefill step reuses each weight byte for many tokens; a decode step for a few
    pre = max(r.intensity for r in rows if r.phase == "prefill")
    dec = min(r.intensity for r in rows if r.phase == "decode")
    assert pre > dec


def test_ridge_decides_the_bound(trace):
    rec = next(r for r in trace if r.flops > 0)
    assert step_roofline(rec, RoofPair(1e6, 1e15)).bound == "memory"  # ridge far right
    assert step_roofline(rec, RoofPair(1e15, 1e6)).bound == "compute"  # ridge far left
    with pytest.raises(ValueError, match="positive"):
        RoofPair(0.0, 1e9)


def test_summary_per_phase_and_in_the_metrics(trace):
    roofs = RoofPair(20e9, 100e9)
    rows = trace_roofline(trace, roofs)
    s = roofline_summary(rows)
    assert s["all"]["num_steps"] == len(rows)
    assert s["prefill"]["num_steps"] + s["decode"]["num_steps"] + s.get("mixed", {}).get("num_steps", 0) == len(rows)
    t = sum(r.duration_s for r in rows)
    assert s["all"]["total_flops_per_s"] == pytest.approx(sum(r.flops for r in rows) / t)
    assert all(math.isfinite(v) for ph in s.values() for v in ph.values())
    assert summarize(trace, roofs).roofline == s  # the trace metrics expose the same figures


def test_prometheus_exports_each_steps_roofline(trace):
    from minillm.metrics.prometheus import TraceMetrics

    roofs = RoofPair(20e9, 100e9)
    metrics = TraceMetrics("m", roofs=roofs)
    metrics.observe(trace)
    get = lambda name: metrics.registry.get_sample_value(f"minillm:{name}", {"model_name": "m"})
    computing = [r for r in trace if r.num_tokens]
    last = step_roofline(computing[-1], roofs)
    assert get("step_arithmetic_intensity") == pytest.approx(last.intensity)
    assert get("step_achieved_flops_per_second") == pytest.approx(last.achieved_flops_per_s)
    assert get("step_roof_fraction") == pytest.approx(last.roof_fraction)
    assert get("step_bandwidth_fraction") == pytest.approx(last.bandwidth_fraction)
    assert get("model_flops_total") == pytest.approx(sum(r.flops for r in computing))
    assert get("engine_step_seconds_total") == pytest.approx(sum(r.duration_s for r in computing))


def test_a_step_above_its_roof_is_flagged_and_counted(trace):
    rec = next(r for r in trace if r.flops > 0)
    fits = RoofPair(1e15, 1e15)  # far above anything a CPU step reaches
    too_low = RoofPair(rec.achieved_bytes_per_s / 2, rec.achieved_flops_per_s / 2)  # roofs below the step itself
    assert not step_roofline(rec, fits).above_roof
    row = step_roofline(rec, too_low)
    assert row.above_roof and row.roof_fraction > 1 and row.to_dict()["above_roof"]
    s = roofline_summary(trace_roofline(trace, too_low))
    assert s["all"]["above_roof_steps"] >= 1 and s["all"]["max_roof_fraction"] > 1
    assert roofline_summary(trace_roofline(trace, fits))["all"]["above_roof_steps"] == 0


def test_the_roofs_are_the_best_probe_shape_and_repeat(monkeypatch):
    """The compute roof is the best of several GEMM shapes; the bandwidth roof the faster of read and copy."""
    import torch

    from minillm.roofline import roofs as R

    # a (512 x 576) @ (576 x 1536) product ran at ~96 GFLOP/s on a 2-core VM where 2048^3 ran at ~45:
    # a roof from the square alone put a prefill step at 112% of it
    speeds = {(2048, 2048, 2048): [45e9, 50e9, 40e9], (512, 576, 1536): [90e9, 96e9, 60e9], (512, 512, 512): [70e9] * 3}
    monkeypatch.setattr(R, "measure_gemm", lambda device, dtype, shape, repeats: speeds[shape])
    monkeypatch.setattr(R, "engine_gemm_kernels", lambda device, dtype: [])  # torch's product alone here
    mm = R.measure_matmul(torch.device("cpu"), torch.float32, shapes=list(speeds))
    assert (mm.params["m"], mm.params["k"], mm.params["n"]) == (512, 576, 1536)
    assert mm.best == 96e9 and mm.median == 90e9 and mm.params["shapes"]["2048x2048x2048"] == 50e9
    read, copy = R.Measurement.of("B/s", [31e9, 30e9]), R.Measurement.of("B/s", [24e9, 25e9])
    assert R.bandwidth_roof(copy, read) is read
    assert R.bandwidth_roof(R.Measurement.of("B/s", [40e9]), read).best == 40e9


def test_measured_roofs_hold_a_real_gemm_and_a_real_read():
    """Measured for real (small): a roof is at least what one of its own probes does again."""
    import torch

    from minillm.roofline import roofs as R

    dev = torch.device("cpu")
    r = R.measure_roofs(dev, dtypes=("float32",), copy_bytes=32 * 2**20, repeats=3)
    assert r.bandwidth_bytes_per_s >= max(r.read_bandwidth.best, r.copy_bandwidth.best)
    assert len(r.matmul["float32"].params["shapes"]) == len(R.MATMUL_SHAPES["cpu"])
    assert r.flops_per_s("float32") == max(r.matmul["float32"].params["shapes"].values())
    assert r.threads == torch.get_num_threads()
    again = R.Roofs.from_dict(json.loads(json.dumps(r.to_dict())))
    assert again.bandwidth_bytes_per_s == r.bandwidth_bytes_per_s and again.flops_per_s("float32") == r.flops_per_s("float32")


def test_the_compute_roof_covers_the_models_prefill_products(monkeypatch):
    """Issue 16: a 512-token prefill step sat at 146% of a compute roof that lacked the products the
    step runs. The default model's (SkinnyLinear's W @ x.T: a transposed right operand) are among the
    shapes measured; another model's are added by get_roofs(extra_shapes=...), and the roof is the best."""
    import torch

    from minillm.loader import load_config
    from minillm.cpu.skinny_linear import transposed_max_rows
    from minillm.roofline import roofs as R

    try:
        cfg = load_config()  # the default model's header only
    except FileNotFoundError as e:
        pytest.skip(str(e))
    qkv = cfg.num_attention_heads * cfg.head_dim + 2 * cfg.num_key_value_heads * cfg.head_dim
    h, inter = cfg.hidden_size, cfg.intermediate_size
    prefill = R.model_gemm_shapes(cfg, 512)
    if transposed_max_rows() >= 512:  # W @ x.T
        assert (qkv, h, 512, "nt") in prefill and (h, inter, 512, "nt") in prefill
    else:  # an Intel CPU: x @ W.T from 33 rows
        assert (512, h, qkv, "nt") in prefill and (512, inter, h, "nt") in prefill
    assert set(prefill) <= set(R.MATMUL_SHAPES["cpu"]), "the default model's prefill products must be measured"
    rows = transposed_max_rows() + 1  # beyond SkinnyLinear's W @ x.T: x @ W.T
    assert R.model_gemm_shapes(cfg, rows)[0] == (rows, h, qkv, "nt")

    # the "nt" layout multiplies by a transposed view, as the engine does; FLOP/s counted as 2mkn
    assert all(f > 0 for f in R.measure_gemm(torch.device("cpu"), torch.float32, (32, 48, 16, "nt"), 2))
    assert R.shape_key((960, 576, 512, "nt")) == "960x576x512-nt" and R.shape_key((512, 512, 512)) == "512x512x512"

    speeds = {(512, 512, 512): [70e9, 60e9], (960, 576, 512, "nt"): [90e9, 120e9], (576, 576, 512, "nt"): [80e9]}
    calls = []

    monkeypatch.setattr(R, "engine_gemm_kernels", lambda device, dtype: [])  # torch's product alone here

    def fake(device, dtype, shape, repeats):
        calls.append(shape)
        return speeds[shape]

    monkeypatch.setattr(R, "measure_gemm", fake)
    mm = R.measure_matmul(torch.device("cpu"), torch.float32, shapes=[(512, 512, 512)])
    assert mm.best == 70e9
    more, added = R.add_shapes(mm, torch.device("cpu"), torch.float32, list(speeds))
    assert added and more.best == 120e9 and (more.params["m"], more.params["layout"]) == (960, "nt")
    assert set(more.params["shapes"]) == {"512x512x512", "960x576x512-nt", "576x576x512-nt"}
    calls.clear()
    same, added = R.add_shapes(more, torch.device("cpu"), torch.float32, list(speeds))
    assert not added and not calls and same is more  # measured once, kept


def test_a_shape_the_engines_own_kernel_multiplies_faster_raises_the_roof(monkeypatch):
    """On a Zen 5 MKL ran ~200 GFLOP/s and the tiled kernel 360-440: torch's GEMM alone put a batched run at
    102% of its roof. Each shape counts its fastest kernel, and the roof says which kernel that was."""
    from minillm.roofline import roofs as R

    torch_speed = {(512, 512, 512): [200e9], (960, 576, 512, "nt"): [190e9]}
    tiled_speed = {(512, 512, 512): [150e9], (960, 576, 512, "nt"): [410e9]}

    def fake(device, dtype, shape, repeats, kernel="torch"):
        return (tiled_speed if kernel == "tiled" else torch_speed)[shape]

    monkeypatch.setattr(R, "measure_gemm", fake)
    monkeypatch.setattr(R, "engine_gemm_kernels", lambda device, dtype: ["tiled"])
    mm = R.measure_matmul(torch.device("cpu"), torch.float32, shapes=list(torch_speed))
    assert mm.best == 410e9 and mm.params["kernel"] == "tiled" and mm.params["layout"] == "nt"
    assert mm.params["shapes"] == {"512x512x512": 200e9, "960x576x512-nt": 410e9}
    assert mm.params["kernels"] == {"960x576x512-nt": "tiled"}  # the square stayed torch's
    older = R.Measurement.of("FLOP/s", [300e9], shapes={"960x576x512-nt": 300e9, "64x64x64": 5e9})
    merged = R.merged_matmul(older, mm)
    assert merged.params["kernels"] == {"960x576x512-nt": "tiled"} and merged.best == 410e9
    assert R.merged_matmul(mm, R.Measurement.of("FLOP/s", [500e9], shapes={"960x576x512-nt": 500e9})
                           ).params["kernels"] == {}  # a faster torch figure takes the shape back


def test_the_tiled_kernel_is_measured_on_a_float32_cpu_product_where_it_is_built():
    from minillm.cpu.kernels import tiled_cpu
    from minillm.roofline import roofs as R

    cpu = torch.device("cpu")
    assert R.engine_gemm_kernels(cpu, torch.bfloat16) == []
    assert R.engine_gemm_kernels(cpu, torch.float32) == (["tiled"] if tiled_cpu.available() else [])
    if tiled_cpu.available():
        assert all(f > 0 for f in R.measure_gemm(cpu, torch.float32, (64, 48, 96, "nt"), 2, kernel="tiled"))


def test_the_read_roof_is_the_faster_of_the_sum_and_the_engines_one_row_product(monkeypatch):
    """torch's sum is no upper bound for the engine's own prefetched stream (on a Zen 5 the one-row product
    read the LM head at 97-105 GB/s while a sum read 75-80): the read roof takes the faster, and says which."""
    from minillm.roofline import roofs as R

    src = torch.ones(4 * 512)
    probe = R.engine_read_probe(src)
    if probe is None:
        pytest.skip("the few-row kernel does not build here")
    assert torch.equal(probe(), torch.full((1, 4), 512.0))  # every byte of src read once: 4 rows of 512 ones
    assert R.engine_read_probe(torch.ones(100)) is None  # less than one row
    timings = iter([1.0, 1.0, 0.5, 0.5, 0.5, 0.5])  # copy x2, sum x2, then the product x2 at twice the speed
    monkeypatch.setattr(R, "time_repeats", lambda fn, device, repeats: [next(timings) for _ in range(repeats)])
    copy, read = R.measure_bandwidth(torch.device("cpu"), 4 * 2**20, repeats=2)
    assert read.params["kernel"] == "sum" and read.best == 4 * 2**20 / 0.5
    timings = iter([1.0, 1.0, 0.5, 0.5, 0.25, 0.25])
    copy, read = R.measure_bandwidth(torch.device("cpu"), 4 * 2**20, repeats=2)
    assert read.params["kernel"] == "one-row product" and read.best == 4 * 2**20 / 0.25
