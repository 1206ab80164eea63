"""minillm as a benchmark subject: drives an LLMEngine directly, reads its metrics and trace."""
from __future__ import annotations

import itertools
import time

import torch

from minillm.bench.subject import BatchRun, DecodeRun
from minillm.config import ModelConfig
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.outputs import RequestOutput
from minillm.engine.trace import StepTrace
from minillm.sampling_params import SamplingParams


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


class MinillmSubject:
    name = "minillm"

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._ids = itertools.count()

    @property
    def config(self) -> ModelConfig:
        return self.engine.model.config

    def decode_path(self) -> str:
        """What runs this engine's decode steps: the paths its steps took so far (StepTrace.path), else
        the fast path it runs (or why none runs)."""
        seen = sorted({t.path for t in self.engine.trace if t.path and t.num_decode_tokens})
        report = self.engine.executor.fast_path_report
        fast = f"fast path {report.name}" if report.name else f"no fast path ({report.why_not})"
        return f"{' + '.join(seen) or 'no decode step yet'}; {fast}"

    def fast_path(self) -> dict:
        """The engine's fast path and its start-up choices (the bench JSON records them)."""
        return self.engine.executor.fast_path_report.to_dict()

    def resize_kv_cache(self, kv_cache_memory_bytes: int) -> None:
        """A fresh engine over the same model with a KV pool of this many bytes (other settings kept)."""
        old = self.engine
        config = old.config.replace(kv_cache_memory_bytes=kv_cache_memory_bytes, num_kv_blocks=None)
        for attn in old.model.attention_layers():  # release the old pool before allocating the new one
            attn.k_cache = attn.v_cache = torch.empty(0)
            attn.k_scale = attn.v_scale = None
        old.executor.release_kv_cache()
        self.engine = LLMEngine(old.model, old.tokenizer, sorted(old.eos_token_ids), config)

    def run(self, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[list[RequestOutput], list[StepTrace]]:
        """The loop of LLM.generate without a progress bar; returns outputs in order and the steps taken."""
        eng = self.engine
        first_step = len(eng.trace)
        ids = []
        for p, sp in zip(prompts, params):
            rid = f"bench-{next(self._ids)}"
            eng.add_request(rid, p, sp)
            ids.append(rid)
        results: dict[str, RequestOutput] = {}
        try:
            while len(results) < len(ids):
                for out in eng.step():
                    if out.finished:
                        results[out.request_id] = out
        except BaseException:
            for rid in set(ids) - results.keys():
                eng.abort_request(rid)
            raise
        return [results[r] for r in ids], eng.trace[first_step:]

    def decode(self, prompt_ids: list[int], max_tokens: int) -> DecodeRun:
        (out,), steps = self.run([prompt_ids], [greedy(max_tokens)])
        m = out.metrics
        decode_steps = [s for s in steps if s.num_decode_tokens == 1 and s.num_prefill_tokens == 0]
        per_token = sum(s.bytes_moved for s in decode_steps) / len(decode_steps) if decode_steps else None
        return DecodeRun(m.ttft, m.last_token_time - m.first_token_time, m.num_generated_tokens, per_token)

    def prefill(self, prompt_ids: list[int]) -> float:
        (out,), _ = self.run([prompt_ids], [greedy(1)])
        return out.metrics.ttft

    def serve(self, prompts: list[list[int]], output_lens: list[int]) -> BatchRun:
        t0 = time.perf_counter()
        outs, steps = self.run(prompts, [greedy(n) for n in output_lens])
        wall = time.perf_counter() - t0
        n_out = sum(len(o.outputs[0].token_ids) for o in outs)
        return BatchRun(
            wall_s=wall,
            prompt_tokens=sum(len(p) for p in prompts),
            output_tokens=n_out,
            generated_tokens=n_out,  # continuous batching computes no padding
            ttft_s=[o.metrics.ttft for o in outs],
            tpot_s=[o.metrics.tpot for o in outs if o.metrics.tpot is not None],
            num_steps=len(steps),
            flops=sum(s.flops for s in steps),
        )


def load_minillm(
    model: str | None,
    dtype: str | torch.dtype,
    device: str | None = None,
    kv_cache_memory_bytes: int | None = None,
    max_num_seqs: int = 128,
    max_num_batched_tokens: int = 2048,
    compile: bool = False,
    quantization: str | None = None,
    quantize_lm_head: bool = False,
    cpu_decode_step: bool | None = None,
) -> MinillmSubject:
    """The engine LLM() builds, with the KV pool sized by the caller and prefix caching off
    (random prompts never hit; off, repeating a prompt cannot skip its prefill)."""
    from minillm.engine.config import resolve_dtype
    from minillm.loader import load_model

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    loaded = load_model(model, dtype=resolve_dtype(dtype), device=dev)
    if quantization is not None or quantize_lm_head:  # weight-only quantization, as LLM(quantization=...) does
        from minillm.quant.apply import quantize_loaded

        quantize_loaded(loaded, quantization, None, lm_head=quantize_lm_head)
    engine = LLMEngine(
        loaded.model, loaded.tokenizer, loaded.eos_token_ids,
        EngineConfig(kv_cache_memory_bytes=kv_cache_memory_bytes, enable_prefix_caching=False,
                     max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                     compile=compile,  # torch.compile'd decode steps (the engine's option)
                     cpu_decode_step=cpu_decode_step),  # None: the one-region CPU step where it applies
    )
    return MinillmSubject(engine)


def kv_bytes_for(config: ModelConfig, dtype: torch.dtype, tokens_per_request: list[int], block_size: int = 16) -> int:
    """KV pool big enough to hold every request at once (whole blocks), so no run is preempted."""
    blocks = sum(-(-t // block_size) for t in tokens_per_request)
    return blocks * block_size * config.kv_bytes_per_token(dtype)
