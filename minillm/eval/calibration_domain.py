"""The calibration-domain pitfall, measured: calibrate on prose or on code, evaluate on both.

AWQ, GPTQ and SmoothQuant choose their scales (AWQ, SmoothQuant) or their error compensation
(GPTQ) from activations recorded on calibration text. If that text is unlike the traffic, the
choice fits the wrong activations; the source articles name code as a domain where this shows.

For each calibrating method, two quantized copies of one model: one calibrated on the "prose"
text's calib split (pydoc_data.topics), one on the "code" text's (the standard library's modules;
minillm.eval.text). Each copy is scored on the eval split of both texts (perplexity change vs the
float model, top-1 agreement) and on the code task suite (pass@1, unit tests), all on the very
weights that served the tasks (minillm.eval.tasks.run, TaskConfig.score_texts).

    minillm eval calibration                           # qwen2.5-coder-0.5b, int4-awq, gptq, w8a8
    minillm eval calibration --methods gptq --limit 8  # a quick look
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from minillm.eval.text import DOMAINS

DEFAULT_METHODS = ("int4-awq", "gptq", "w8a8")


@dataclass
class DomainRow:
    method: str
    calibration: str  # "prose" | "code" | "-" for float
    pass_at_1: float | None = None
    passed: int | None = None
    total: int | None = None
    ppl_change_pct: dict | None = None  # {text: % vs float}
    top1_agreement: dict | None = None  # {text: share of positions agreeing with float}
    error: str | None = None


def schemes(methods: tuple[str, ...]) -> tuple[str, ...]:
    return ("float",) + tuple(f"{m}+calib-{d}" for m in methods for d in DOMAINS)


def run_calibration_domain(model: str | None, methods: tuple[str, ...] = DEFAULT_METHODS, limit: int | None = None,
                           group_size: int | None = None, windows: int = 8, context_len: int = 256,
                           log: Callable[[str], None] = print) -> tuple[list[DomainRow], list, dict]:
    """(summary rows, the task rows with every output, workload)."""
    from minillm.eval.tasks.run import TaskConfig, run_tasks
    from minillm.quant.apply import CALIBRATION

    bad = [m for m in methods if m not in CALIBRATION]
    if bad or not methods:
        raise ValueError(f"methods must be calibrating ones ({', '.join(CALIBRATION)}), got {list(methods)}")
    cfg = TaskConfig("code", model, schemes(methods), limit=limit, group_size=group_size, score_texts=DOMAINS,
                     score_windows=windows, score_context_len=context_len)
    task_rows, workload = run_tasks(cfg, log=log)
    workload |= {"score_texts": {d: f"eval split, {windows} x {context_len} tokens" for d in DOMAINS},
                 "calibration_tokens": {m: "x".join(map(str, CALIBRATION[m])) for m in methods}}
    rows = []
    for t in task_rows:
        method, _, calib = t.scheme.partition("+calib-")
        r = DomainRow(method, calib or "-", error=t.error)
        if t.error is None:
            r.pass_at_1, r.passed, r.total = t.score, t.passed, t.total
            r.ppl_change_pct = {d: t.text_scores[d].get("ppl_change_pct") for d in DOMAINS}
            r.top1_agreement = {d: t.text_scores[d].get("top1_agreement") for d in DOMAINS}
        rows.append(r)
    return rows, task_rows, workload


def gaps(rows: list[DomainRow]) -> list[dict]:
    """Per method: code-calibrated minus prose-calibrated, on each evaluation (negative ppl = better)."""
    out = []
    by = {(r.method, r.calibration): r for r in rows if r.error is None}
    for m in dict.fromkeys(r.method for r in rows if r.calibration != "-"):
        p, c = by.get((m, "prose")), by.get((m, "code"))
        if p is None or c is None:
            continue
        out.append({"method": m, "pass_at_1_pts": round(100 * (c.pass_at_1 - p.pass_at_1), 2),
                    **{f"ppl_change_pts_{d}": round(c.ppl_change_pct[d] - p.ppl_change_pct[d], 3) for d in DOMAINS}})
    return out


def format_table(rows: list[DomainRow]) -> str:
    head = (f"{'method':10s} {'calibrated on':>13s} {'code pass@1':>13s} "
            + " ".join(f"{'d ppl ' + d:>13s} {'agree ' + d:>12s}" for d in DOMAINS))
    lines = [head]
    for r in rows:
        if r.error:
            lines.append(f"{r.method:10s} {r.calibration:>13s} ERROR {r.error[:100]}")
            continue
        cells = " ".join(f"{r.ppl_change_pct[d]:+12.2f}% {r.top1_agreement[d]:12.4f}" for d in DOMAINS)
        lines.append(f"{r.method:10s} {r.calibration:>13s} {100 * r.pass_at_1:6.1f}% {r.passed:2d}/{r.total:<3d} {cells}")
    return "\n".join(lines)
