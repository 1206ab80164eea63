"""Run a task suite through the real engine, once per quantization scheme.

Each scheme builds its own LLM(model, quantization=..., kv_cache_dtype=...) -- the same front
door a user calls, so what is scored is what is served -- and sends every item of the suite
in one LLM.generate call: greedy, continuous batching over all items at once. The code suite
scores pass@1 (one greedy completion per task, unit tests in a subprocess: code_check), the
facts suite exact match (facts_check). Scheme names are `minillm eval ppl`'s settings
("int4", "gptq+kv-int8", ...), parsed by the same function.
"""
from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from minillm.eval.tasks.code_check import STOP, check_all
from minillm.eval.tasks.code_data import CODE_TASKS
from minillm.eval.tasks.facts_check import is_match, messages
from minillm.eval.tasks.facts_data import FACT_ITEMS

SUITES = ("code", "facts")
DEFAULT_MODEL = {"code": "qwen2.5-coder-0.5b", "facts": None}  # None: the default SmolLM2-135M-Instruct
DEFAULT_MAX_TOKENS = {"code": 160, "facts": 16}  # code: the longest reference body is ~190 tokens


@dataclass
class ItemResult:
    item_id: str
    passed: bool
    output: str  # the model's text
    status: str = ""  # code: passed / failed / timeout / syntax_error
    detail: str = ""


@dataclass
class TaskRow:
    scheme: str
    suite: str
    passed: int = 0
    total: int = 0
    score: float | None = None  # passed / total
    change_pts: float | None = None  # score - float score, in percentage points (float in the run)
    flips_vs_float: int | None = None  # items whose pass/fail differs from the float run
    changed_vs_float: int | None = None  # items whose output text differs from the float run
    load_s: float | None = None  # load + quantize
    generate_s: float | None = None
    check_s: float | None = None
    output_tokens: int = 0
    perplexity: float | None = None  # with --ppl: `minillm eval ppl` of the same scheme and model
    ppl_change_pct: float | None = None
    # TaskConfig.score_texts: {text: {"perplexity", "ppl_change_pct", "top1_agreement"}}, scored on the
    # very model that generated (one quantization per scheme), compared with the float row
    text_scores: dict[str, dict] = field(default_factory=dict)
    error: str | None = None
    items: list[ItemResult] = field(default_factory=list)


@dataclass
class TaskConfig:
    suite: str = "facts"
    model: str | None = None
    schemes: tuple[str, ...] = ("float",)
    max_tokens: int | None = None  # None: DEFAULT_MAX_TOKENS[suite]
    limit: int | None = None  # only the first `limit` items (quick checks, tests)
    group_size: int | None = None
    score_texts: tuple[str, ...] = ()  # also score perplexity on these texts' eval splits (minillm.eval.text)
    score_context_len: int = 256
    score_windows: int = 8

    def resolved_model(self) -> str | None:
        return self.model if self.model is not None else DEFAULT_MODEL[self.suite]

    def resolved_max_tokens(self) -> int:
        return self.max_tokens or DEFAULT_MAX_TOKENS[self.suite]


def suite_items(suite: str, limit: int | None = None) -> list:
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose one of {SUITES}")
    items = CODE_TASKS if suite == "code" else FACT_ITEMS
    return list(items[:limit] if limit else items)


def run_tasks(cfg: TaskConfig, log: Callable[[str], None] = print) -> tuple[list[TaskRow], dict]:
    """Score every scheme; rows in the given order, each compared with the "float" row if present."""
    from minillm.eval.ppl import parse_setting

    settings = [parse_setting(s) for s in cfg.schemes]  # every bad name fails before any load
    items = suite_items(cfg.suite, cfg.limit)
    workload = {"suite": cfg.suite, "items": len(items), "model": cfg.resolved_model() or "default (SmolLM2-135M-Instruct)",
                "max_tokens": cfg.resolved_max_tokens(), "decoding": "greedy (temperature 0), one sample (pass@1)",
                "stop": STOP if cfg.suite == "code" else None, "group_size": cfg.group_size}
    rows = []
    for s in settings:
        row = TaskRow(s.name, cfg.suite, total=len(items))
        try:
            _run_scheme(row, s, cfg, items)
        except Exception as e:  # one broken scheme must not hide the others
            row.error = f"{type(e).__name__}: {e}"
        gc.collect()  # the previous scheme's weights and KV pool go before the next load
        rows.append(row)
        log(format_row(row))
    compare_with_float(rows)
    return rows, workload


def _run_scheme(row: TaskRow, s, cfg: TaskConfig, items: list) -> None:
    from minillm import LLM, SamplingParams
    from minillm.eval.ppl import DTYPES
    from minillm.quant.methods import GROUPED

    t0 = time.perf_counter()
    dtype = {"dtype": DTYPES[s.dtype]} if s.dtype else {}
    llm = LLM(cfg.resolved_model(), **dtype, quantization=s.quantization, kv_cache_dtype=s.kv_cache_dtype,
              quantize_lm_head=s.lm_head, quantization_calibration=s.calibration,
              quantization_group_size=cfg.group_size if s.quantization in GROUPED else None)
    row.load_s = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    if cfg.suite == "code":
        params = SamplingParams(temperature=0.0, max_tokens=cfg.resolved_max_tokens(), stop=list(STOP))
        outs = llm.generate([t.prompt for t in items], params, use_tqdm=False)
    else:
        params = SamplingParams(temperature=0.0, max_tokens=cfg.resolved_max_tokens())
        outs = llm.chat([messages(i) for i in items], params, use_tqdm=False)
    row.generate_s = round(time.perf_counter() - t0, 2)
    texts = [o.outputs[0].text for o in outs]
    row.output_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    score_texts(row, llm, s, cfg)
    del llm, outs
    t0 = time.perf_counter()
    if cfg.suite == "code":
        results = check_all(items, texts)
        row.items = [ItemResult(t.task_id, r.passed, x, r.status, r.detail) for t, r, x in zip(items, results, texts)]
    else:
        row.items = [ItemResult(i.item_id, is_match(i, x), x) for i, x in zip(items, texts)]
    row.check_s = round(time.perf_counter() - t0, 2)
    row.passed = sum(r.passed for r in row.items)
    row.score = row.passed / row.total if row.total else None


def score_texts(row: TaskRow, llm, s, cfg: TaskConfig) -> None:
    """Perplexity of the served model itself (the quantized weights that just generated) on each text."""
    from minillm.eval.paged import score_windows, windows
    from minillm.eval.text import corpus_tokens

    for text in cfg.score_texts:
        n, length = cfg.score_windows, cfg.score_context_len
        wins = windows(corpus_tokens(llm.tokenizer, "eval", n * length, domain=text), length, n)
        sc = score_windows(llm.loaded.model, wins, chunk_size=64, kv_cache_dtype=s.kv_cache_dtype)
        row.text_scores[text] = {"perplexity": round(sc.perplexity, 4), "top1": sc.top1.flatten().tolist()}


def compare_with_float(rows: list[TaskRow]) -> None:
    base = next((r for r in rows if r.scheme == "float" and r.error is None), None)
    if base is not None:
        ref = {i.item_id: i for i in base.items}
        for r in rows:
            if r.error is None:
                r.change_pts = round(100.0 * (r.score - base.score), 2)
                r.flips_vs_float = sum(i.passed != ref[i.item_id].passed for i in r.items)
                r.changed_vs_float = sum(i.output != ref[i.item_id].output for i in r.items)
                for text, sc in r.text_scores.items():
                    want = base.text_scores.get(text)
                    if want is not None:
                        sc["ppl_change_pct"] = round(100.0 * (sc["perplexity"] / want["perplexity"] - 1.0), 3)
                        same = [a == b for a, b in zip(sc["top1"], want["top1"])]
                        sc["top1_agreement"] = round(sum(same) / len(same), 4)
    for r in rows:  # the per-position argmax served the comparison; the report keeps the summary
        for sc in r.text_scores.values():
            sc.pop("top1", None)


def attach_perplexity(rows: list[TaskRow], cfg: TaskConfig, log: Callable[[str], None] = print) -> dict:
    """Perplexity and its change vs float (minillm.eval.ppl, default slice) for every row's scheme,
    so one table holds both kinds of quality; returns the ppl workload."""
    import torch

    from minillm.eval.ppl import EvalConfig, run_eval
    from minillm.loader import load_model

    ecfg = EvalConfig(group_size=cfg.group_size, settings=tuple(r.scheme for r in rows))
    ppl_rows, workload = run_eval(ecfg, load_model(cfg.resolved_model(), dtype=torch.float32), log=log)
    by = {p.setting: p for p in ppl_rows}
    for r in rows:
        p = by.get(r.scheme)
        if p is not None and p.error is None:
            r.perplexity, r.ppl_change_pct = round(p.perplexity, 4), round(p.ppl_change_pct, 3)
    return workload


HEADER = f"{'scheme':16s} {'score':>7s} {'passed':>8s} {'d vs float':>10s} {'flips':>5s} {'changed':>7s} {'load s':>7s} {'gen s':>7s} {'check s':>7s} {'out tok':>7s} {'ppl':>8s} {'d ppl %':>8s}"


def format_row(r: TaskRow) -> str:
    if r.error:
        return f"{r.scheme:16s} ERROR {r.error[:120]}"
    change = "" if r.change_pts is None else f"{r.change_pts:+.1f} pt"
    flips = "" if r.flips_vs_float is None else str(r.flips_vs_float)
    changed = "" if r.changed_vs_float is None else str(r.changed_vs_float)
    ppl = "" if r.perplexity is None else f"{r.perplexity:8.3f} {r.ppl_change_pct:+8.2f}"
    return (f"{r.scheme:16s} {100 * r.score:6.1f}% {r.passed:>3d}/{r.total:<4d} {change:>10s} {flips:>5s} {changed:>7s} "
            f"{r.load_s:7.1f} {r.generate_s:7.1f} {r.check_s:7.1f} {r.output_tokens:7d} {ppl}").rstrip()


def format_table(rows: list[TaskRow]) -> str:
    return "\n".join([HEADER] + [format_row(r) for r in rows])


def rows_as_dicts(rows: list[TaskRow]) -> list[dict]:
    return [asdict(r) for r in rows]
