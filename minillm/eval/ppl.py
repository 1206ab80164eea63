"""Perplexity and top-1 agreement of quantization settings against the float model.

A setting names a weight method and/or a KV cache dtype, joined by "+":
"float", "int8", "int4", "int4-awq", "gptq", "w8a8", "fp8", "gguf", "kv-int8", "kv-fp8", and
"head8" (an int8 LM head), "calib-code" / "calib-prose" (which text AWQ, GPTQ and SmoothQuant
calibrate on), and "bf16" / "fp32" (the float dtype the copy runs in, when it differs from the
loaded model's), e.g. "int4+head8+kv-int8", "gptq+calib-code" or "bf16". Every setting scores the same fixed
slice of one text (EvalConfig.text: "prose", pydoc_data.topics, or "code", the standard library's
modules; always the "eval" split, the calibrating methods read the disjoint "calib" split) through
the paged path (minillm.eval.paged), on its own copy of the float model loaded once.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass

import torch

from minillm.eval.paged import score_windows, windows
from minillm.eval.text import corpus_tokens

DEFAULT_SETTINGS = ("float", "int8", "int4", "int4-awq", "kv-int8", "kv-fp8", "int4+kv-int8")
KV_PREFIX = "kv-"
CALIB_PREFIX = "calib-"
HEAD = "head8"
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}  # setting part -> the copy's float dtype (LLM(dtype=...))


@dataclass(frozen=True)
class Setting:
    name: str
    quantization: str | None = None  # LLM(quantization=...)
    kv_cache_dtype: str = "auto"  # LLM(kv_cache_dtype=...)
    lm_head: bool = False  # LLM(quantize_lm_head=True)
    calibration: str = "prose"  # LLM(quantization_calibration=...)
    dtype: str | None = None  # "bf16" / "fp32": LLM(dtype=...); None keeps the loaded model's

    @property
    def torch_dtype(self) -> torch.dtype | None:
        from minillm.engine.config import resolve_dtype

        return resolve_dtype(DTYPES[self.dtype]) if self.dtype else None

    def needs_copy(self, model) -> bool:
        """Whether this setting changes the loaded model (so it needs a private copy)."""
        recast = self.dtype is not None and self.torch_dtype != model.embed_tokens.weight.dtype
        return self.quantization is not None or self.lm_head or recast


def parse_setting(name: str) -> Setting:
    """'int4+kv-int8' -> Setting(quantization='int4', kv_cache_dtype='int8'); ValueError names what is wrong."""
    from minillm.eval.text import DOMAINS
    from minillm.quant.apply import CALIBRATION
    from minillm.quant.methods import LLM_METHODS

    quant, kv, head, calib, dtype = None, "auto", False, None, None
    for part in name.split("+"):
        if part == "float":
            continue
        if part in DTYPES:
            if dtype is not None:
                raise ValueError(f"setting {name!r} names two float dtypes")
            dtype = part
            continue
        if part == HEAD:
            head = True
            continue
        if part.startswith(CALIB_PREFIX):
            calib = part[len(CALIB_PREFIX):]
            if calib not in DOMAINS:
                raise ValueError(f"unknown calibration text {calib!r} in setting {name!r}; choose one of {DOMAINS}")
        elif part.startswith(KV_PREFIX):
            kv = part[len(KV_PREFIX):]
        elif part in LLM_METHODS:
            if quant is not None:
                raise ValueError(f"setting {name!r} names two weight methods")
            quant = part
        else:
            raise ValueError(f"unknown part {part!r} in setting {name!r}; use float, {', '.join(LLM_METHODS)} "
                             f"{HEAD}, {', '.join(DTYPES)}, kv-<dtype> or calib-<text>, joined by '+'")
    if calib is not None and quant not in CALIBRATION:
        raise ValueError(f"setting {name!r}: only {', '.join(CALIBRATION)} calibrate, not {quant or 'float'}")
    return Setting(name, quant, kv, head, calib or "prose", dtype)


@dataclass
class EvalRow:
    setting: str
    perplexity: float | None = None
    ppl_change_pct: float | None = None  # vs the float row
    top1_agreement: float | None = None  # share of positions whose argmax equals the float model's
    weight_bytes_per_token: int | None = None
    kv_bytes_per_token: int | None = None
    seconds: float | None = None
    error: str | None = None


@dataclass
class EvalConfig:
    context_len: int = 256
    max_windows: int = 8
    chunk_size: int = 64
    group_size: int | None = None
    settings: tuple[str, ...] = DEFAULT_SETTINGS
    text: str = "prose"  # which domain's eval split is scored (minillm.eval.text)


TEXT_DESCRIPTIONS = {
    "prose": "pydoc_data.topics, eval split (first half of the topics, sorted by name)",
    "code": "the standard library's top-level modules, eval split (first half by file name, one excerpt each)",
}


def run_eval(cfg: EvalConfig, loaded=None, log=print) -> tuple[list[EvalRow], dict]:
    """Score every setting; returns the rows and the workload description."""
    from minillm.attention.kv_quant import kv_bytes_per_token, resolve_kv_cache_dtype
    from minillm.loader import load_model
    from minillm.quant.footprint import weight_bytes_per_token

    settings = [parse_setting(s) for s in cfg.settings]  # all bad names fail before any work
    if loaded is None:
        loaded = load_model(dtype=torch.float32)
    ids = corpus_tokens(loaded.tokenizer, "eval", cfg.context_len * cfg.max_windows, domain=cfg.text)
    wins = windows(ids, cfg.context_len, cfg.max_windows)
    mc = loaded.model.config
    workload = {"text": TEXT_DESCRIPTIONS[cfg.text],
                "context_len": cfg.context_len, "windows": wins.shape[0], "scored_tokens": wins.numel() - wins.shape[0],
                "chunk_size": cfg.chunk_size, "group_size": cfg.group_size, "model": loaded.source}
    base = run_setting(Setting("float"), loaded, wins, cfg)  # the reference every row is compared with
    rows: list[EvalRow] = []
    for s in settings:
        t0 = time.perf_counter()
        row = EvalRow(s.name)
        try:
            if not s.needs_copy(loaded.model) and s.kv_cache_dtype == "auto":
                scores, model = base
            else:
                scores, model = run_setting(s, loaded, wins, cfg)
            row.perplexity = scores.perplexity
            row.ppl_change_pct = 100.0 * (scores.perplexity / base[0].perplexity - 1.0)
            row.top1_agreement = (scores.top1 == base[0].top1).double().mean().item()
            row.weight_bytes_per_token = weight_bytes_per_token(model)
            kv_dtype = resolve_kv_cache_dtype(s.kv_cache_dtype) or model.embed_tokens.weight.dtype
            row.kv_bytes_per_token = kv_bytes_per_token(mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, kv_dtype)
        except Exception as e:  # one broken setting must not hide the others
            row.error = f"{type(e).__name__}: {e}"
        row.seconds = round(time.perf_counter() - t0, 2)
        log(format_row(row))
        rows.append(row)
    return rows, workload


def run_setting(s: Setting, loaded, wins: torch.Tensor, cfg: EvalConfig):
    """(scores, model) for one setting on a private copy of the float model."""
    model = setting_model(loaded, s, cfg.group_size)
    return score_windows(model, wins, chunk_size=cfg.chunk_size, kv_cache_dtype=s.kv_cache_dtype), model


def setting_model(loaded, s: Setting, group_size: int | None):
    """The loaded model itself when the setting leaves it unchanged, else a private copy in the setting's
    dtype, quantized by its method."""
    from minillm.quant.apply import quantize_loaded
    from minillm.quant.methods import GROUPED

    if not s.needs_copy(loaded.model):
        return loaded.model
    model = copy.deepcopy(loaded.model)
    if s.torch_dtype is not None:
        model.to(s.torch_dtype)
    if s.quantization is not None or s.lm_head:
        gs = group_size if s.quantization in GROUPED else None
        quantize_loaded(dataclasses.replace(loaded, model=model), s.quantization, gs, lm_head=s.lm_head,
                        calibration=s.calibration)
    return model


HEADER = f"{'setting':20s} {'ppl':>8s} {'d ppl %':>8s} {'top-1 agr':>9s} {'W B/tok':>9s} {'KV B/tok':>8s} {'s':>6s}"


def format_row(r: EvalRow) -> str:
    if r.error:
        return f"{r.setting:20s} ERROR {r.error[:100]}"
    return (f"{r.setting:20s} {r.perplexity:8.3f} {r.ppl_change_pct:+8.2f} {r.top1_agreement:9.4f} "
            f"{r.weight_bytes_per_token / 1e6:8.1f}M {r.kv_bytes_per_token:8d} {r.seconds:6.1f}")


def format_table(rows: list[EvalRow]) -> str:
    return "\n".join([HEADER] + [format_row(r) for r in rows])


def targets(rows: list[EvalRow]) -> list[dict]:
    """The issue's quality targets, judged on these rows (None when a row is missing or failed)."""
    by = {r.setting: r for r in rows if r.error is None}

    def d(name):
        return by[name].ppl_change_pct if name in by else None

    checks = [
        ("int8 weights raise perplexity by < 1%", d("int8"), lambda v: v < 1.0),
        ("KV int8 raises perplexity by < 0.5%", d("kv-int8"), lambda v: v < 0.5),
    ]
    out = [{"name": n, "value": v, "passed": None if v is None else bool(ok(v))} for n, v, ok in checks]
    awq, rtn = d("int4-awq"), d("int4")
    out.append({"name": "int4 AWQ raises perplexity less than int4 RTN", "value": [awq, rtn],
                "passed": None if awq is None or rtn is None else awq < rtn})
    return out
