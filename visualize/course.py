"""Small helpers the notebooks share: more engines on one loaded model, running them dry.

Loading the default model takes seconds; an experiment that compares engine
knobs builds several engines around the same weights instead. Each engine owns
its KV pool; `attach()` points the model's attention layers at it before use.
"""
from __future__ import annotations

import time

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.outputs import RequestOutput


def new_engine(llm, *, num_blocks: int = 256, block_size: int = 16, max_num_seqs: int = 64,
               max_num_batched_tokens: int = 2048, enable_prefix_caching: bool = True,
               enable_chunked_prefill: bool = True, max_model_len: int | None = None) -> LLMEngine:
    """An LLMEngine on `llm`'s model and tokenizer with its own KV pool and scheduler knobs."""
    return LLMEngine(
        llm.loaded.model, llm.tokenizer, llm.loaded.eos_token_ids,
        EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, enable_prefix_caching=enable_prefix_caching,
                     max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                     enable_chunked_prefill=enable_chunked_prefill, max_model_len=max_model_len),
    )


def drain(engine: LLMEngine) -> dict[str, RequestOutput]:
    """Step until every request finished; returns the final output per request id."""
    engine.executor.attach()  # this engine's KV pool, in case another engine used the model since
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def timed_drain(engine: LLMEngine) -> tuple[dict[str, RequestOutput], float]:
    t0 = time.perf_counter()
    done = drain(engine)
    return done, time.perf_counter() - t0


def text_table(headers: list[str], rows: list[list[object]]) -> str:
    """A plain aligned table (notebooks print it; nbval can compare it as text)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def median(xs: list[float]) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
