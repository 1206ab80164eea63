"""`minillm roofline`: the roofs are measured (small sizes here), cached per machine, and a trace is placed under them.

MINILLM_CACHE_DIR points the cache at a temporary folder. What can fail: the
cache must be written under the machine's key and read back instead of
measuring again (unless asked), a corrupt cache must be replaced, and the CLI's
JSON must give every computing step its intensity, achieved FLOP/s and
fraction of the roof.
"""
from __future__ import annotations

import json

import pytest
import torch

from minillm.cli import main as minillm_main
from minillm.engine.trace import dump_trace
from minillm.roofline.machine import machine_info
from minillm.roofline import roofs as roofs_module
from minillm.roofline.roofs import Roofs, cache_path, get_roofs, measured_while_busy
from minillm.roofline.timing import time_repeats
from tests.helpers.engine_utils import greedy, make_engine, random_prompts, run_to_completion, tiny_model

SMALL = dict(copy_bytes=8 * 2**20, matmul_n=128, repeats=3)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(roofs_module, "measured_while_busy", lambda roofs: None)  # caching is what is tested here
    prev = torch.get_num_threads()
    torch.set_num_threads(1)  # the cache key includes the thread count: keep it fixed
    yield tmp_path / "cache"
    torch.set_num_threads(prev)


def test_roofs_are_measured_then_cached_per_machine(cache):
    roofs = get_roofs("cpu", **SMALL)
    path = cache_path(machine_info("cpu"))
    assert path.parent == cache and path.name.startswith("roofs-") and path.exists()
    assert roofs.bandwidth_bytes_per_s > 0 and roofs.read_bandwidth.median > 0
    assert set(roofs.matmul) == {"float32", "bfloat16"} and roofs.flops_per_s(torch.float32) > 0
    assert roofs.matmul["float32"].params["n"] == 128 and len(roofs.bandwidth.values) == 3
    again = get_roofs("cpu", **SMALL)
    assert again.measured_at == roofs.measured_at  # read from the cache, not measured
    fresh = get_roofs("cpu", remeasure=True, **SMALL)
    assert fresh.measured_at > roofs.measured_at
    assert json.loads(path.read_text())["measured_at"] == fresh.measured_at
    # a re-measure keeps the best of both: never below what the cache held
    assert fresh.bandwidth_bytes_per_s >= roofs.bandwidth_bytes_per_s
    assert fresh.flops_per_s(torch.float32) >= roofs.flops_per_s(torch.float32)
    path.write_text("{not json")
    assert get_roofs("cpu", **SMALL).measured_at > fresh.measured_at  # a corrupt cache is measured over
    more = get_roofs("cpu", dtypes=("float32", "bfloat16", "float16"), **SMALL)
    assert "float16" in more.matmul  # a dtype the cache lacks is measured


def test_a_remeasure_that_came_out_lower_keeps_the_cached_roofs(cache, monkeypatch):
    """A roof is an upper bound: a re-measure during a busy minute must not lower it."""
    roofs = get_roofs("cpu", **SMALL)
    real = roofs_module.measure_roofs

    def slower(*args, **kw):  # the same probes, every repeat 100x slower, on a quiet-looking machine
        r = real(*args, **kw)
        for m in (r.read_bandwidth, r.copy_bandwidth, *r.matmul.values()):
            m.values[:] = [v / 100 for v in m.values]
        r.bandwidth = roofs_module.bandwidth_roof(r.copy_bandwidth, r.read_bandwidth)
        return r

    monkeypatch.setattr(roofs_module, "measure_roofs", slower)
    low = get_roofs("cpu", remeasure=True, **SMALL)
    assert low.measured_at > roofs.measured_at
    assert low.bandwidth_bytes_per_s == roofs.bandwidth_bytes_per_s
    assert low.read_bandwidth.best == roofs.read_bandwidth.best
    assert low.flops_per_s(torch.float32) == roofs.flops_per_s(torch.float32)
    kept = Roofs.from_dict(json.loads(cache_path(machine_info("cpu")).read_text()))
    assert kept.bandwidth_bytes_per_s == roofs.bandwidth_bytes_per_s
    # the merge in either order takes the faster probe: a faster fresh run does raise the roof
    raw = slower("cpu", ("float32", "bfloat16"), **SMALL)
    assert raw.bandwidth_bytes_per_s < roofs.bandwidth_bytes_per_s
    for merged in (roofs_module.best_of(raw, roofs), roofs_module.best_of(roofs, raw)):
        assert merged.bandwidth_bytes_per_s == roofs.bandwidth_bytes_per_s
        assert merged.flops_per_s("bfloat16") == roofs.flops_per_s("bfloat16")


def test_roofs_measured_while_busy_are_used_but_not_cached(cache, monkeypatch):
    monkeypatch.setattr(roofs_module, "measured_while_busy", measured_while_busy)  # the real check
    real = roofs_module.measure_roofs

    def stalled(*args, **kw):  # what a probe shows when another tenant holds a core
        r = real(*args, **kw)
        r.machine_state["before"].update(stall_ratio=1.0, load_average=[0.5, 0.5, 0.5])  # quiet before, whatever
        r.machine_state["after"].update(stall_ratio=7.5, load_average=[0.5, 0.5, 0.5])  # this machine is doing now
        return r

    monkeypatch.setattr(roofs_module, "measure_roofs", stalled)
    with pytest.warns(UserWarning, match="busy.*not cached"):
        roofs = get_roofs("cpu", **SMALL)
    assert roofs.bandwidth_bytes_per_s > 0 and not cache_path(machine_info("cpu")).exists()
    assert "after: parallel ops 7.5x" in measured_while_busy(roofs)
    monkeypatch.setattr(roofs_module, "measure_roofs", real)
    quiet = get_roofs("cpu", **SMALL)
    if measured_while_busy(quiet) is None:  # this machine was quiet: that measurement is kept
        assert cache_path(machine_info("cpu")).exists()


def test_a_load_above_the_cpus_is_busy_even_when_the_probe_is_quiet():
    """A tenant keeping every core busy between the stall probes shows in the load average instead."""
    from minillm.roofline.roofs import Measurement, Roofs

    def roofs(load: float, ratio: float = 1.2) -> Roofs:
        state = {"load_average": [load, load, load], "stall_ratio": ratio}
        return Roofs(machine={"logical_cpus": 2}, bandwidth=Measurement.of("B/s", [1e10]),
                     read_bandwidth=Measurement.of("B/s", [1e10]), copy_bandwidth=Measurement.of("B/s", [1e10]),
                     matmul={}, measured_at=0.0, machine_state={"before": state, "after": state})

    assert measured_while_busy(roofs(3.5)) is None  # this process on both cores and a little more: quiet
    assert "load average 4.3 on 2 CPUs" in measured_while_busy(roofs(4.3))  # what cached 173 GFLOP/s for 407
    assert "parallel ops" in measured_while_busy(roofs(0.5, ratio=7.5))


def test_extra_gemm_shapes_join_the_cached_roof(cache, monkeypatch):
    """A model's own prefill products (get_roofs(extra_shapes=...)) are measured once, added to the
    cached compute roof, and read back afterwards."""
    roofs = get_roofs("cpu", dtypes=("float32",), **SMALL)
    extra = [(64, 48, 32, "nt")]
    more = get_roofs("cpu", dtypes=("float32",), extra_shapes=extra, **SMALL)
    assert "64x48x32-nt" in more.matmul["float32"].params["shapes"] and "128x128x128" in more.matmul["float32"].params["shapes"]
    assert more.flops_per_s("float32") == max(more.matmul["float32"].params["shapes"].values())
    assert more.flops_per_s("float32") >= roofs.flops_per_s("float32")
    monkeypatch.setattr(roofs_module, "measure_gemm", lambda *a, **k: pytest.fail("measured again"))
    again = get_roofs("cpu", dtypes=("float32",), extra_shapes=extra, **SMALL)
    assert again.matmul["float32"].params["shapes"] == more.matmul["float32"].params["shapes"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events need a GPU")
def test_cuda_events_time_gpu_work():
    a = torch.randn(2048, 2048, device="cuda")
    times = time_repeats(lambda: a @ a, torch.device("cuda"), 3)
    assert len(times) == 3 and all(0 < t < 10 for t in times)


def test_roofline_cli_places_a_trace(cache, tmp_path, capsys):
    get_roofs("cpu", **SMALL)  # the CLI then reads the cache instead of measuring 512 MiB
    engine = make_engine(tiny_model(), max_num_batched_tokens=32)
    for i, p in enumerate(random_prompts(2, 97, 12, 40, seed=5)):
        engine.add_request(str(i), p, greedy(4))
    run_to_completion(engine)
    trace_path = tmp_path / "trace.jsonl"
    dump_trace(engine.trace, str(trace_path))
    out = tmp_path / "roof.json"
    assert minillm_main(["roofline", "--json", "--trace", str(trace_path), "--output", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    report = json.loads(out.read_text())
    assert printed == report
    assert report["roofs"]["matmul"]["float32"]["params"]["n"] == 128  # the cached roofs
    tr = report["trace"]
    assert tr["ridge_intensity"] == pytest.approx(
        max(report["roofs"]["matmul"]["float32"]["values"]) / max(report["roofs"]["bandwidth"]["values"]))  # best repeats
    steps = tr["steps"]
    assert len(steps) == sum(1 for r in engine.trace if r.flops > 0) and tr["phases"]["all"]["num_steps"] == len(steps)
    for s in steps:
        assert s["intensity"] > 0 and s["achieved_flops_per_s"] > 0 and 0 < s["roof_fraction"]
        assert s["bound"] in ("memory", "compute")
    assert minillm_main(["roofline", "--trace", str(trace_path)]) == 0
    text = capsys.readouterr().out
    assert "ridge point" in text and "decode" in text and "of roof" in text


def test_roofline_cli_rejects_bad_input(cache, tmp_path):
    with pytest.raises(SystemExit, match="unknown dtype"):
        minillm_main(["roofline", "--dtypes", "float33"])
    get_roofs("cpu", **SMALL)
    with pytest.raises(SystemExit, match="cannot read the trace"):
        minillm_main(["roofline", "--trace", str(tmp_path / "missing.jsonl")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\n')
    with pytest.raises(SystemExit, match="cannot read the trace"):
        minillm_main(["roofline", "--trace", str(bad)])


def test_the_printed_roofs_say_how_old_they_are():
    """A cached Xeon roof of 336 GFLOP/s measured 448 the next day: roofs older than an hour say so."""
    import time

    from minillm.bench.report import STALE_ROOFS_S, format_roofs
    from minillm.roofline.roofs import Measurement, Roofs

    def roofs(age_s: float) -> Roofs:
        bw = Measurement.of("B/s", [1e10])
        return Roofs(machine={"device_name": "cpu", "torch_threads": 2}, bandwidth=bw, read_bandwidth=bw,
                     copy_bandwidth=bw, matmul={"float32": Measurement.of("FLOP/s", [4e11], m=8, k=8, n=8)},
                     measured_at=time.time() - age_s)

    fresh, old = format_roofs(roofs(60)), format_roofs(roofs(STALE_ROOFS_S + 7200))
    assert "measured 1 min ago" in fresh and "--remeasure-roofs" not in fresh
    assert "3.0 h old" in old and "same-run roof" in old
