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
