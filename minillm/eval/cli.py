"""`minillm eval ppl`: perplexity and top-1 agreement per quantization setting, table + JSON.

    minillm eval ppl                                   # the issue's seven settings on the default model
    minillm eval ppl --settings float,int8,gguf --context-len 128 --windows 4 --json out.json
    minillm eval tasks --suite facts --quantization float,int8,int4     # exact match, default model
    minillm eval tasks --suite code --quantization float,gguf --json code.json   # pass@1, qwen2.5-coder-0.5b
    minillm eval ppl --text code --settings float,gptq,gptq+calib-code       # perplexity on stdlib code
    minillm eval calibration --json calib.json        # prose- vs code-calibrated AWQ/GPTQ/W8A8 on both domains
"""
from __future__ import annotations

import argparse
import sys

import torch


def build_parser() -> argparse.ArgumentParser:
    from minillm.eval.ppl import DEFAULT_SETTINGS, EvalConfig

    d = EvalConfig()
    p = argparse.ArgumentParser(prog="minillm eval", description="quality evaluation")
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("ppl", help="perplexity + top-1 agreement with the float model, per quantization setting")
    q.add_argument("--model", default=None, help="model path (default: SmolLM2-135M-Instruct GGUF)")
    q.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                   help="comma separated: float, int8, int4, int4-awq, gptq, w8a8, fp8, gguf, head8 (int8 LM head), kv-int8, kv-fp8, "
                        "calib-code / calib-prose (what AWQ/GPTQ/W8A8 calibrate on; default prose), joined with '+'")
    q.add_argument("--text", choices=("prose", "code"), default="prose",
                   help="the eval split scored: prose (pydoc_data.topics) or code (the standard library's modules)")
    q.add_argument("--context-len", type=int, default=d.context_len)
    q.add_argument("--windows", type=int, default=d.max_windows, help="number of context-length windows scored")
    q.add_argument("--chunk-size", type=int, default=d.chunk_size, help="prefill chunk per window per step")
    q.add_argument("--group-size", type=int, default=None, help="int4 group size: 32, 64, 128 or 256 (default 32)")
    q.add_argument("--threads", type=int, default=None)
    q.add_argument("--json", default=None, metavar="PATH", help="write the report here")
    add_tasks_parser(sub)
    add_calibration_parser(sub)
    return p


def add_calibration_parser(sub) -> None:
    from minillm.eval.calibration_domain import DEFAULT_METHODS

    c = sub.add_parser("calibration", help="the calibration-domain pitfall: AWQ/GPTQ/W8A8 calibrated on prose vs "
                                           "code, scored on both texts and on the code tasks")
    c.add_argument("--model", default="qwen2.5-coder-0.5b")
    c.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="comma separated: int4-awq, gptq, w8a8")
    c.add_argument("--limit", type=int, default=None, help="only the first N code tasks")
    c.add_argument("--windows", type=int, default=8, help="perplexity windows per text")
    c.add_argument("--context-len", type=int, default=256)
    c.add_argument("--group-size", type=int, default=None)
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--json", default=None, metavar="PATH")


def calibration_main(a) -> int:
    from minillm.bench.report import build_report, write_json
    from minillm.eval.calibration_domain import format_table, gaps, run_calibration_domain
    from minillm.eval.tasks.run import HEADER, rows_as_dicts
    from minillm.roofline.machine import machine_info

    methods = tuple(m.strip() for m in a.methods.split(",") if m.strip())
    print(HEADER, flush=True)
    try:
        rows, task_rows, workload = run_calibration_domain(a.model, methods, a.limit, a.group_size, a.windows,
                                                           a.context_len, log=lambda line: print(line, flush=True))
    except ValueError as e:
        raise SystemExit(f"minillm eval calibration: {e}")
    table = format_table(rows)
    print("\n" + table)
    found = gaps(rows)
    for g in found:
        print(f"{g['method']}: code-calibrated minus prose-calibrated: pass@1 {g['pass_at_1_pts']:+.1f} pt, "
              + ", ".join(f"d ppl {d} {g['ppl_change_pts_' + d]:+.2f} pt" for d in ("prose", "code")))
    if a.json:
        write_json(build_report("eval_calibration", machine=machine_info("cpu"), threads=torch.get_num_threads(),
                                workload=workload, rows=rows, gaps=found, table=table,
                                task_rows=rows_as_dicts(task_rows)), a.json)
        print(f"wrote {a.json}", file=sys.stderr)
    return 0 if all(r.error is None for r in rows) else 1


def add_tasks_parser(sub) -> None:
    from minillm.eval.tasks.run import DEFAULT_MAX_TOKENS, DEFAULT_MODEL, SUITES

    t = sub.add_parser("tasks", help="task suites: code pass@1 (unit tests) or facts exact match, per quantization scheme")
    t.add_argument("--suite", choices=SUITES, default="facts",
                   help=f"code: {DEFAULT_MODEL['code']} completes functions, unit tests decide; "
                        "facts: the default model answers short questions, exact match")
    t.add_argument("--model", default=None, help="model name or path (default: per suite, see --suite)")
    t.add_argument("--quantization", default="float",
                   help="comma separated schemes, as `eval ppl --settings`: float, int8, int4, int4-awq, gptq, w8a8, "
                        "fp8, gguf, head8, kv-int8, kv-fp8, joined with '+'")
    t.add_argument("--max-tokens", type=int, default=None,
                   help=f"per item (default: code {DEFAULT_MAX_TOKENS['code']}, facts {DEFAULT_MAX_TOKENS['facts']})")
    t.add_argument("--limit", type=int, default=None, help="only the first N items")
    t.add_argument("--group-size", type=int, default=None, help="int4 group size for int4/int4-awq/gptq")
    t.add_argument("--threads", type=int, default=None,
                   help="torch threads (1 is often faster on a small shared machine)")
    t.add_argument("--ppl", action="store_true",
                   help="also score perplexity (as `eval ppl`) of every scheme on the same model: one table")
    t.add_argument("--show", action="store_true", help="print every item's output and verdict")
    t.add_argument("--json", default=None, metavar="PATH", help="write the report (every item's output) here")


def tasks_main(a) -> int:
    from minillm.bench.report import build_report, write_json
    from minillm.eval.ppl import parse_setting
    from minillm.eval.tasks.run import HEADER, TaskConfig, attach_perplexity, format_table, rows_as_dicts, run_tasks
    from minillm.roofline.machine import machine_info

    schemes = tuple(s.strip() for s in a.quantization.split(",") if s.strip())
    try:
        if not schemes:
            raise ValueError("--quantization names no scheme")
        for s in schemes:
            parse_setting(s)
        if (a.max_tokens is not None and a.max_tokens < 1) or (a.limit is not None and a.limit < 1):
            raise ValueError("--max-tokens and --limit must be >= 1")
    except ValueError as e:
        raise SystemExit(f"minillm eval tasks: {e}")
    cfg = TaskConfig(a.suite, a.model, schemes, a.max_tokens, a.limit, a.group_size)
    print(HEADER, flush=True)
    rows, workload = run_tasks(cfg, log=lambda line: print(line, flush=True))
    if a.ppl:
        workload["perplexity"] = attach_perplexity(rows, cfg, log=lambda line: print(line, flush=True))
    if a.show:
        for r in rows:
            for i in r.items:
                print(f"[{r.scheme}] {'PASS' if i.passed else 'fail'} {i.item_id}: {i.output[:80]!r} {i.detail[:60]}")
    table = format_table(rows)
    print("\n" + table)
    if a.json:
        write_json(build_report("eval_tasks", machine=machine_info("cpu"), threads=torch.get_num_threads(),
                                workload=workload, rows=rows_as_dicts(rows), table=table), a.json)
        print(f"wrote {a.json}", file=sys.stderr)
    return 0 if all(r.error is None for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    from minillm.bench.report import build_report, write_json
    from minillm.eval.ppl import EvalConfig, format_table, parse_setting, run_eval, targets, HEADER
    from minillm.loader import load_model
    from minillm.roofline.machine import machine_info

    a = build_parser().parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.cmd == "tasks":
        return tasks_main(a)
    if a.cmd == "calibration":
        return calibration_main(a)
    settings = tuple(s.strip() for s in a.settings.split(",") if s.strip())
    try:
        for s in settings:
            parse_setting(s)
        if a.context_len < 2 or a.windows < 1 or a.chunk_size < 1:
            raise ValueError("--context-len must be >= 2, --windows and --chunk-size >= 1")
    except ValueError as e:
        raise SystemExit(f"minillm eval ppl: {e}")
    cfg = EvalConfig(a.context_len, a.windows, a.chunk_size, a.group_size, settings, text=a.text)
    print(HEADER, flush=True)
    rows, workload = run_eval(cfg, load_model(a.model, dtype=torch.float32), log=lambda line: print(line, flush=True))
    checks = targets(rows)
    for t in checks:
        print({True: "[PASS]", False: "[FAIL]", None: "[----]"}[t["passed"]], t["name"], t["value"])
    if a.json:
        write_json(build_report("eval_ppl", machine=machine_info("cpu"), threads=torch.get_num_threads(),
                                workload=workload, rows=rows, targets=checks, table=format_table(rows)), a.json)
        print(f"wrote {a.json}", file=sys.stderr)
    return 0 if all(r.error is None for r in rows) else 1
