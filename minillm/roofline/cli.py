"""`minillm roofline`: this machine's roofs (measured once, cached), and optionally a trace's steps under them.

    minillm roofline                      # cached roofs, or measure them (a few seconds) and cache
    minillm roofline --remeasure --json   # measure again, print JSON
    minillm roofline --trace run.jsonl    # + where each phase of a recorded step trace sits (minillm demo --trace)

Bandwidth is the faster of a large read (a sum) and a large copy (read + write
bytes, STREAM's "copy"), compute the best of several GEMM shapes per dtype, each
the best of several repeats: roofs are upper bounds. On a GPU both are timed with
CUDA events. The cache lives in
~/.cache/minillm (MINILLM_CACHE_DIR), keyed by machine, thread count and torch.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minillm roofline", description="measure (or show the cached) machine roofs")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="matmul dtypes, comma separated")
    p.add_argument("--remeasure", action="store_true", help="ignore the cache and measure again")
    p.add_argument("--threads", type=int, default=None, help="torch threads (the cache is per thread count)")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="first wait up to this long for other tenants' load to stop stalling parallel ops")
    p.add_argument("--trace", default=None, help="a step trace (JSONL) to place on the roofline")
    p.add_argument("--trace-dtype", default="float32", help="which matmul roof the trace's steps are compared with")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--output", default=None, help="also write the JSON here")
    return p


def format_trace_roofline(summary: dict[str, dict[str, float]]) -> str:
    lines = ["steps of the trace (medians per phase)"]
    for phase, r in summary.items():
        lines.append(f"  {phase:8s} {r['num_steps']:5.0f} steps  {r['median_intensity']:8.1f} FLOP/B  "
                     f"{r['median_achieved_flops_per_s'] / 1e9:8.1f} GFLOP/s  {r['median_achieved_bytes_per_s'] / 1e9:6.1f} GB/s"
                     f"  {r['median_roof_fraction']:6.1%} of roof  ({r['memory_bound_steps']:.0f} memory-bound)")
    above = summary.get("all", {}).get("above_roof_steps", 0)
    if above:
        lines.append(f"  warning: {above:.0f} steps ran above their roof (up to {summary['all']['max_roof_fraction']:.0%}); "
                     "a roof is an upper bound, so these roofs were measured too low for this run (other load, "
                     "another thread count): minillm roofline --remeasure --threads N (the run's threads)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from minillm.bench.report import format_roofs, jsonable
    from minillm.roofline.roofs import DTYPES, get_roofs

    args = build_parser().parse_args(argv)
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise SystemExit(f"minillm roofline: unknown dtype {', '.join(bad) or args.dtypes!r}; choose from {', '.join(DTYPES)}")
    if args.trace_dtype not in dtypes:
        dtypes += (args.trace_dtype,)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not args.json:
        print("measuring the roofs (or reading the cache)...", file=sys.stderr, flush=True)
    roofs = get_roofs(device, remeasure=args.remeasure, dtypes=dtypes, wait_quiet_s=args.wait_quiet)
    out: dict[str, Any] = {"roofs": jsonable(roofs)}
    text = [format_roofs(roofs)]
    if args.trace:
        from minillm.engine.trace import load_trace
        from minillm.roofline.steps import RoofPair, roofline_summary, trace_roofline

        try:
            trace = load_trace(args.trace)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"minillm roofline: cannot read the trace {args.trace}: {e}")
        if not any(r.flops > 0 for r in trace):
            raise SystemExit(f"minillm roofline: the trace {args.trace} has no step that computed anything")
        pair = RoofPair.from_roofs(roofs, args.trace_dtype)
        rows = trace_roofline(trace, pair)
        summary = roofline_summary(rows)
        out["trace"] = {"path": args.trace, "dtype": args.trace_dtype, "ridge_intensity": pair.ridge_intensity,
                        "phases": summary, "steps": [r.to_dict() for r in rows]}
        text.append(f"  ridge point ({args.trace_dtype}): {pair.ridge_intensity:.1f} FLOP/B")
        text.append(format_trace_roofline(summary))
    print(json.dumps(out, indent=2) if args.json else "\n".join(text))
    if args.output:
        from minillm.bench.report import write_json

        write_json(out, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
