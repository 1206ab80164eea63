"""`minillm bench {latency,throughput,roofs}`: argument parsing and model loading.

    python -m minillm.bench latency --compare transformers --json latency.json
    python -m minillm.bench throughput --compare transformers --num-requests 128
    python -m minillm.bench roofs --remeasure
"""
from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

import torch

from minillm.roofline.machine_state import QUIET_STALL_RATIO, settle
from minillm.bench.report import format_latency, format_roofs, format_throughput, write_json
from minillm.bench.workload import LatencyWorkload, ThroughputWorkload

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="GGUF file or Hugging Face folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--compare", choices=["transformers"], action="append", default=[],
                   help="also run this peer on the same workload, interleaved")
    p.add_argument("--hf-cache", choices=["dynamic", "static"], default="dynamic",
                   help="transformers' KV cache implementation")
    p.add_argument("--threads", type=int, default=None, help="torch threads for every subject (default: torch's)")
    p.add_argument("--compile", action="store_true", help="minillm with torch.compile'd decode steps")
    p.add_argument("--json", dest="json_out", default=None, help="write the full report here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--remeasure-roofs", action="store_true", help="measure the machine roofs again")
    p.add_argument("--no-roofs", action="store_true", help="skip the roofs (no bandwidth fraction)")
    p.add_argument("--quiet", action="store_true", help="no per-repeat log lines")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="before each repeat wait up to this long for other tenants' load to stop "
                        "stalling multi-threaded ops (the probe is recorded either way)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minillm bench", description="Measure minillm, optionally beside peers.")
    sub = parser.add_subparsers(dest="command", required=True)

    lat = sub.add_parser("latency", help="batch-1 decode tok/s and 1k-token prefill time")
    _common(lat)
    lat.add_argument("--prompt-len", type=int, default=32)
    lat.add_argument("--output-len", type=int, default=128)
    lat.add_argument("--prefill-len", type=int, default=1024)
    lat.add_argument("--repeats", type=int, default=5, help="decode repeats per subject")
    lat.add_argument("--prefill-repeats", type=int, default=3)

    thr = sub.add_parser("throughput", help="many requests at once: output and total tok/s, TTFT/TPOT percentiles")
    _common(thr)
    thr.add_argument("--num-requests", type=int, default=128)
    thr.add_argument("--prompt-len-range", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    thr.add_argument("--output-len-range", type=int, nargs=2, default=[16, 128], metavar=("MIN", "MAX"))
    thr.add_argument("--repeats", type=int, default=1)
    thr.add_argument("--max-num-seqs", type=int, default=128)
    thr.add_argument("--max-num-batched-tokens", type=int, default=2048)
    thr.add_argument("--hf-batch-size", type=int, default=32, help="transformers' static batch size")

    roofs = sub.add_parser("roofs", help="measure (or show the cached) bandwidth and matmul roofs")
    roofs.add_argument("--device", default=None)
    roofs.add_argument("--remeasure", action="store_true")
    roofs.add_argument("--threads", type=int, default=None)
    roofs.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                       help="first wait up to this long for a quiet machine")
    roofs.add_argument("--json", dest="json_out", default=None)
    return parser


def _device(args: argparse.Namespace) -> str:
    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def _roofs(args: argparse.Namespace, device: str):
    from minillm.roofline.roofs import get_roofs

    if getattr(args, "no_roofs", False):
        return None
    _log("machine roofs: " + ("measuring" if args.remeasure_roofs else "cached or measuring"))
    roofs = get_roofs(device, remeasure=args.remeasure_roofs, wait_quiet_s=args.wait_quiet)
    _log(format_roofs(roofs))
    return roofs


def _subjects(args: argparse.Namespace, device: str, kv_bytes: int | None = None, **engine_kw: Any) -> list:
    from minillm.bench.minillm_subject import load_minillm

    _log(f"loading minillm ({args.dtype}, {device})")
    subjects = [load_minillm(args.model, args.dtype, device, kv_bytes, compile=args.compile, **engine_kw)]
    if "transformers" in args.compare:
        from minillm.bench.hf_subject import load_transformers

        _log(f"loading transformers ({args.dtype}, {device})")
        cache = None if args.hf_cache == "dynamic" else args.hf_cache
        subjects.append(load_transformers(args.model, DTYPES[args.dtype], device, cache,
                                          getattr(args, "hf_batch_size", 32)))
    return subjects


def _settings(args: argparse.Namespace, device: str) -> dict[str, Any]:
    return {"model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized)", "device": device,
            "threads": torch.get_num_threads(), "compare": list(args.compare), "hf_cache": args.hf_cache,
            "prefix_caching": False, "compile": args.compile, "seed": args.seed, "wait_quiet_s": args.wait_quiet}


def _latency(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.bench.runner import latency_report

    device = _device(args)
    roofs = _roofs(args, device)
    subjects = _subjects(args, device)
    wl = LatencyWorkload(args.prompt_len, args.output_len, args.prefill_len, args.seed)
    report, summary = latency_report(
        subjects, subjects[0].config, DTYPES[args.dtype], wl, roofs, _settings(args, device),
        args.repeats, args.prefill_repeats, device=device, log=(lambda s: None) if args.quiet else _log,
        settle=functools.partial(settle, args.wait_quiet),
    )
    print(format_latency(summary))
    return report


def _throughput(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.bench.minillm_subject import kv_bytes_for
    from minillm.bench.runner import throughput_report

    device = _device(args)
    roofs = _roofs(args, device)
    wl = ThroughputWorkload(args.num_requests, tuple(args.prompt_len_range), tuple(args.output_len_range), args.seed)
    subjects = _subjects(args, device, None, max_num_seqs=args.max_num_seqs,
                         max_num_batched_tokens=args.max_num_batched_tokens)
    # Size minillm's KV pool to hold every request at once, so the run measures batching, not preemption.
    cfg = subjects[0].config
    prompts, outs = wl.requests(cfg.vocab_size)
    kv_dtype = subjects[0].engine.runner.spec.dtype
    subjects[0].resize_kv_cache(kv_bytes_for(cfg, kv_dtype, [len(p) + n for p, n in zip(prompts, outs)]))
    settings = {**_settings(args, device), "max_num_seqs": args.max_num_seqs,
                "max_num_batched_tokens": args.max_num_batched_tokens, "hf_batch_size": args.hf_batch_size,
                "kv_cache_bytes": subjects[0].engine.runner.kv_cache_bytes}
    report, summary = throughput_report(
        subjects, cfg, DTYPES[args.dtype], wl, roofs, settings, args.repeats, device=device,
        log=(lambda s: None) if args.quiet else _log, settle=functools.partial(settle, args.wait_quiet),
    )
    print(format_throughput(summary))
    return report


def _show_roofs(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.bench.report import jsonable
    from minillm.roofline.roofs import get_roofs

    roofs = get_roofs(_device(args), remeasure=args.remeasure, wait_quiet_s=args.wait_quiet)
    print(format_roofs(roofs))
    return jsonable(roofs)


def _warn_if_noisy(report: dict[str, Any]) -> None:
    states = (report.get("machine_state") or {}).values()
    worst = max((s.get("stall_ratio") or 0.0 for s in states), default=0.0)
    if worst > QUIET_STALL_RATIO:
        _log(f"warning: another tenant kept a core busy during this run (stall ratio {worst:.3g}); "
             "multi-threaded figures are unreliable: compare interleaved ratios, use --threads 1 or --wait-quiet")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = {"latency": _latency, "throughput": _throughput, "roofs": _show_roofs}[args.command](args)
    _warn_if_noisy(report)
    if args.json_out:
        write_json(report, args.json_out)
        _log(f"wrote {args.json_out}")
    return 0
