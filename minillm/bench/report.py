"""The JSON report and its one-screen text summary.

One report holds everything needed to judge a figure later: the machine, the
versions, the measured roofs, the machine's state before and after, the engine
settings, the workload, every repeat, medians, ratios and the targets.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import time
from typing import Any

from minillm.bench.targets import Target
from minillm.roofline.roofs import Measurement


def jsonable(obj: Any) -> Any:
    """Dataclasses, Targets and Measurements to plain JSON values (NaN becomes null)."""
    if isinstance(obj, Target):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(obj.to_dict() if hasattr(obj, "to_dict") else dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def build_report(benchmark: str, **sections: Any) -> dict[str, Any]:
    return jsonable({"benchmark": benchmark, "created": dt.datetime.now().isoformat(timespec="seconds"), **sections})


def write_json(report: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _med(m: Any) -> float | None:
    return m.median if isinstance(m, Measurement) else (m.get("median") if isinstance(m, dict) else None)


def format_targets(targets: list[Target]) -> list[str]:
    lines = []
    for t in targets:
        mark = {True: "PASS", False: "FAIL", None: "----"}[t.passed]
        lines.append(f"  [{mark}] {t.name}: {_fmt(t.value)} (target >= {t.threshold:g})  {t.description}")
    return lines


# a roof cached in a slow hour sits below this run's own probes: the fraction of it overstates
STALE_CACHED_ROOF = ("  note: this run's probes beat the cached roof (it was measured in a slower hour); "
                     "`minillm bench roofs --remeasure` raises it")


def format_latency(summary: dict[str, Any]) -> str:
    lines = ["batch-1 latency (medians)"]
    bpt = summary["bytes_per_decode_token"]["value"]
    lines.append(f"  bytes per decode token: {bpt / 1e6:.1f} MB; bandwidth ceiling "
                 f"{_fmt(summary['ceiling_decode_tok_s'], '.1f')} tok/s")
    same_run = summary.get("same_run_roof")
    if same_run is not None and same_run.best:
        lines.append(f"  same-run roof: {same_run.best / 1e9:.1f} GB/s, best of {len(same_run.values)} probes between "
                     f"the repeats ({', '.join(f'{v / 1e9:.1f}' for v in same_run.values)}); ceiling "
                     f"{_fmt(summary.get('same_run_ceiling_decode_tok_s'), '.1f')} tok/s")
    stale = False
    for name, f in summary["figures"].items():
        frac = _med(f.get("decode_bandwidth_fraction"))
        same = _med(f.get("decode_same_run_roof_fraction"))
        stale = stale or (frac is not None and same is not None and frac > same)
        of_same = f", {_fmt(same * 100, '.0f')}% of the same-run roof" if same is not None else ""
        lines.append(
            f"  {name:13s} decode {_med(f['decode_tok_s']):7.2f} tok/s ({_fmt(frac and frac * 100, '.0f')}% of the "
            f"cached roof{of_same})"
            f" | prefill {f['prefill_s'].params.get('prompt_len')} tok {_med(f['prefill_s']) * 1e3:8.1f} ms"
            f" ({_med(f['prefill_tok_s']):7.0f} tok/s)"
        )
    if stale:
        lines.append(STALE_CACHED_ROOF)
    for name, r in summary["ratios"].items():
        lines.append(f"  minillm / {name}: decode x{_fmt(r['decode_tok_s'])} (paired x{_fmt(r['decode_tok_s_paired'])}),"
                     f" prefill x{_fmt(r['prefill_speed'])} (paired x{_fmt(r['prefill_speed_paired'])})")
    return "\n".join(lines + ["targets"] + format_targets(summary["targets"]))


def format_throughput(summary: dict[str, Any]) -> str:
    lines = ["throughput (medians; latency percentiles over all requests)"]
    same_run = summary.get("same_run_roof")
    if same_run is not None and same_run.best:
        lines.append(f"  same-run roof: {same_run.best / 1e9:.0f} GFLOP/s ({same_run.probe}), best of "
                     f"{len(same_run.values)} probes between the repeats "
                     f"({', '.join(f'{v / 1e9:.0f}' for v in same_run.values)})")
    for name, f in summary["figures"].items():
        lines.append(
            f"  {name:13s} output {_med(f['output_tok_s']):8.1f} tok/s, total {_med(f['total_tok_s']):8.1f} tok/s,"
            f" wall {_med(f['wall_s']):6.1f} s, generated/requested {_fmt(f['generated_per_requested'])}"
        )
        if f.get("achieved_flops_per_s") is not None:
            frac = f.get("compute_roof_fraction")
            same = f.get("same_run_compute_roof_fraction")
            lines.append(f"  {'':13s} {_med(f['achieved_flops_per_s']) / 1e9:.1f} GFLOP/s counted"
                         + (f" = {frac:.0%} of the dtype's cached matmul roof" if frac is not None else "")
                         + (f", {same:.0%} of the same-run roof" if same is not None else ""))
            if frac is not None and same is not None and frac > same:
                lines.append(STALE_CACHED_ROOF)
        ttft, tpot = f["ttft_s"], f["tpot_s"]
        lines.append(
            f"  {'':13s} TTFT p50/p90/p99 {_fmt(ttft['p50'])}/{_fmt(ttft['p90'])}/{_fmt(ttft['p99'])} s,"
            f" TPOT {_fmt(tpot['p50'] * 1e3)}/{_fmt(tpot['p90'] * 1e3)}/{_fmt(tpot['p99'] * 1e3)} ms"
        )
    for name, r in summary["ratios"].items():
        lines.append(f"  minillm / {name}: output x{_fmt(r['output_tok_s'])}, total x{_fmt(r['total_tok_s'])}")
    return "\n".join(lines + ["targets"] + format_targets(summary["targets"]))


STALE_ROOFS_S = 3600.0  # a cached Xeon roof of 336 GFLOP/s measured 448 the next day: older than this, say so


def format_roofs(roofs: Any) -> str:
    threads = roofs.machine.get("torch_threads")
    age_s = time.time() - roofs.measured_at if roofs.measured_at else None
    when = f", measured {age_s / 60:.0f} min ago" if age_s is not None else ""
    lines = [f"machine roofs ({roofs.machine.get('device_name')}, {threads} thread{'' if threads == 1 else 's'}{when})",
             f"  bandwidth roof {roofs.bandwidth_bytes_per_s / 1e9:.1f} GB/s (best repeat; read-only "
             f"{roofs.read_bandwidth.best / 1e9:.1f}, copy read+write {roofs.copy_bandwidth.best / 1e9:.1f} GB/s)"]
    for name, m in roofs.matmul.items():
        shape = "x".join(str(m.params.get(k)) for k in ("m", "k", "n"))
        if m.params.get("layout", "nn") != "nn":  # the right operand transposed, as in x @ W.T
            shape += f" ({m.params['layout']})"
        if m.params.get("kernel", "torch") != "torch":  # the engine's own kernel multiplied it fastest
            shape += f" by minillm's {m.params['kernel']} kernel"
        lines.append(f"  matmul {name:9s} {m.best / 1e9:.0f} GFLOP/s (best of {len(m.params.get('shapes', {1: 0}))} "
                     f"GEMM shapes: {shape}; median {m.median / 1e9:.0f})")
    if age_s is not None and age_s > STALE_ROOFS_S:  # a vCPU's clock and its share of memory move from day to day
        lines.append(f"  note: these roofs are {age_s / 3600:.1f} h old; latency and throughput probe the roof again "
                     f"between their repeats and judge their targets against that same-run roof")
    return "\n".join(lines)


def format_serve(summary: dict[str, Any]) -> str:
    ms = lambda d: f"p50 {_fmt(d['p50'] * 1e3)} / p90 {_fmt(d['p90'] * 1e3)} / p99 {_fmt(d['p99'] * 1e3)} ms"
    lines = [f"serve: {summary['num_completed']}/{summary['num_requests']} requests completed "
             f"({summary['num_errors']} errors) in {summary['wall_s']:.2f} s",
             f"  {summary['requests_per_s']:.2f} req/s, {summary['output_tok_s']:.1f} output tok/s, "
             f"{summary['total_tok_s']:.1f} total tok/s",
             f"  TTFT {ms(summary['ttft_s'])}", f"  TPOT {ms(summary['tpot_s'])}",
             f"  ITL  {ms(summary['itl_s'])}", f"  e2e  {ms(summary['e2e_s'])}"]
    lines += [f"  error: {e}" for e in summary["errors"][:3]]
    return "\n".join(lines)


def format_prefix(summary: dict[str, Any]) -> str:
    lines = ["prefix caching: TTFT of user turns after a shared prefix (medians)"]
    for name, f in summary["figures"].items():
        lines.append(f"  {name:9s} TTFT {_med(f['ttft_s']) * 1e3:8.1f} ms; prompt tokens computed "
                     f"{f['computed_prompt_tokens']}, found in the cache {f['prefix_hit_tokens']}")
    r = summary["ratios"]
    lines.append(f"  TTFT cut x{_fmt(r['ttft_cut'])} (paired x{_fmt(r['ttft_cut_paired'])}); "
                 f"computed tokens cut x{_fmt(r['computed_tokens_cut'])}")
    return "\n".join(lines + ["targets"] + format_targets(summary["targets"]))
