"""`minillm bench quant`: batch-1 decode speed per quantization setting, beside its bandwidth roof.

Every setting gets its own engine over its own copy of the model (loaded once,
quantized per setting); decode repeats alternate the order of the settings so
a drifting shared machine hits all alike. For each setting the report holds:

- weight bytes per token: what a batch-1 decode step streams, counted from the
  tensors the model holds (minillm.quant.footprint);
- KV bytes per token (values + scales) and the mean KV bytes a step reads over
  the workload's contexts;
- the bandwidth roof: measured copy bandwidth / bytes per step, the speed if
  the step were nothing but reading those bytes once;
- measured decode tok/s and its fraction of the roof.

llama.cpp: issue 6 quotes llama-bench on this machine running the same GGUF
at about 110-145 tok/s without its AMX weight repacking and about 275 with it.
Those are quoted reference figures, not measured in this run (run
`minillm bench latency --compare llama.cpp` where llama-cpp-python is
installed to measure them side by side).
"""
from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from minillm.bench.workload import LatencyWorkload

DEFAULT_SETTINGS = ("float", "int8", "int4", "gguf", "gguf+head8", "kv-int8", "int4+head8+kv-int8")
LLAMA_CPP_QUOTED_TOK_S = {"no_repack": (110.0, 145.0), "repack": (275.0, 275.0)}
LLAMA_CPP_NOTE = ("quoted in issue 6 (llama-bench, same GGUF, this machine), not measured in this run: "
                  "without AMX weight repacking 110-145 tok/s, with it about 275")


@dataclass
class QuantSubjectRow:
    setting: str
    weight_bytes_per_token: int
    kv_bytes_per_token: int
    mean_kv_read_bytes: float
    roof_tok_s: float | None
    load_s: float
    tok_s: list[float] = field(default_factory=list)

    @property
    def median_tok_s(self) -> float:
        return statistics.median(self.tok_s) if self.tok_s else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["median_tok_s"] = self.median_tok_s
        d["roof_fraction"] = self.median_tok_s / self.roof_tok_s if self.roof_tok_s else None
        lo, hi = LLAMA_CPP_QUOTED_TOK_S["no_repack"]
        d["ratio_to_llama_cpp_quoted"] = {"no_repack_110": self.median_tok_s / lo, "no_repack_145": self.median_tok_s / hi,
                                          "repack_275": self.median_tok_s / LLAMA_CPP_QUOTED_TOK_S["repack"][0]}
        return d


def build_subject(loaded, setting: str, group_size: int | None = None, max_num_seqs: int = 8):
    """(MinillmSubject, model) for one setting, on a private copy of the float model unless it is 'float'."""
    from minillm.bench.minillm_subject import MinillmSubject
    from minillm.engine.config import EngineConfig
    from minillm.engine.llm_engine import LLMEngine
    from minillm.eval.ppl import parse_setting
    from minillm.quant.apply import quantize_loaded

    s = parse_setting(setting)
    model = loaded.model
    if s.quantization is not None or s.lm_head:
        model = copy.deepcopy(loaded.model)
        gs = group_size if s.quantization in ("int4", "int4-awq") else None
        quantize_loaded(dataclasses.replace(loaded, model=model), s.quantization, gs, lm_head=s.lm_head)
    engine = LLMEngine(model, loaded.tokenizer, loaded.eos_token_ids,
                       EngineConfig(num_kv_blocks=64, enable_prefix_caching=False, kv_cache_dtype=s.kv_cache_dtype,
                                    max_num_seqs=max_num_seqs, max_num_batched_tokens=1024))
    return MinillmSubject(engine), model, s


def measure_quant(
    loaded, settings: tuple[str, ...], workload: LatencyWorkload, bandwidth: float | None,
    repeats: int = 3, group_size: int | None = None, log: Callable[[str], None] = lambda s: None,
) -> list[QuantSubjectRow]:
    from minillm.attention.kv_quant import kv_bytes_per_token, resolve_kv_cache_dtype
    from minillm.quant.footprint import weight_bytes_per_token

    cfg = loaded.model.config
    subjects, rows = [], []
    contexts = range(workload.prompt_len + 1, workload.prompt_len + workload.output_len)
    for name in settings:
        t0 = time.perf_counter()
        subj, model, s = build_subject(loaded, name, group_size)
        kv_dtype = resolve_kv_cache_dtype(s.kv_cache_dtype) or model.embed_tokens.weight.dtype
        kv_tok = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, kv_dtype)
        kv_read = kv_tok * statistics.mean(contexts)
        wb = weight_bytes_per_token(model)
        roof = bandwidth / (wb + kv_read) if bandwidth else None
        rows.append(QuantSubjectRow(name, wb, kv_tok, kv_read, roof, round(time.perf_counter() - t0, 2)))
        subjects.append(subj)
        log(f"built {name}: {wb / 1e6:.1f} MB weights/token, {kv_tok} B KV/token ({rows[-1].load_s}s)")
    for s in subjects:  # warm-up: allocations, oneDNN primitives, first-call packing
        s.engine.executor.attach()  # KV-only settings share the float model: point it at this engine's pool
        s.decode(workload.decode_prompt(-1, cfg.vocab_size), min(8, workload.output_len))
    for r in range(repeats):
        prompt = workload.decode_prompt(r, cfg.vocab_size)
        order = list(range(len(subjects)))
        for i in order if r % 2 == 0 else order[::-1]:
            subjects[i].engine.executor.attach()
            run = subjects[i].decode(prompt, workload.output_len)
            rows[i].tok_s.append(run.decode_tok_s)
            log(f"decode {rows[i].setting:20s} repeat {r}: {run.decode_tok_s:7.2f} tok/s")
    return rows


def format_quant(rows: list[QuantSubjectRow], bandwidth: float | None) -> str:
    bw = f"{bandwidth / 1e9:.1f} GB/s" if bandwidth else "not measured"
    lines = [f"batch-1 decode per setting (copy bandwidth {bw})",
             f"{'setting':20s} {'W MB/tok':>9s} {'KV B/tok':>9s} {'roof tok/s':>10s} {'tok/s':>8s} {'of roof':>8s} "
             f"{'vs 110-145':>11s} {'vs 275':>7s}"]
    for r in rows:
        d = r.to_dict()
        roof = f"{r.roof_tok_s:10.1f}" if r.roof_tok_s else f"{'n/a':>10s}"
        frac = f"{d['roof_fraction']:8.1%}" if d["roof_fraction"] else f"{'n/a':>8s}"
        q = d["ratio_to_llama_cpp_quoted"]
        lines.append(f"{r.setting:20s} {r.weight_bytes_per_token / 1e6:9.1f} {r.kv_bytes_per_token:9d} {roof} "
                     f"{r.median_tok_s:8.1f} {frac} {q['no_repack_145']:5.2f}-{q['no_repack_110']:4.2f} "
                     f"{q['repack_275']:7.2f}")
    lines.append("llama.cpp: " + LLAMA_CPP_NOTE)
    return "\n".join(lines)
