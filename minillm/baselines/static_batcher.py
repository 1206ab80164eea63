"""Static batching on the real engine: the baseline that continuous batching replaced.

Why it exists: notebook 05 compares continuous batching with the system it
replaced, run for real. A static server (Hugging Face `generate` on a padded
batch, FasterTransformer before Orca) takes B requests, runs them as one batch
until the LONGEST has finished, and only then takes the next B. A row whose own
answer ended early stays in the batch: its decode steps are computed and thrown
away (HF keeps generating pad tokens for it).

This driver does exactly that on an LLMEngine: each request of a batch is
submitted with the batch's longest max_tokens and EOS ignored, so every row
keeps decoding; each row's own stop rule (its max_tokens, EOS, stop token ids)
is applied to its output stream by the driver; when every row has stopped, the
rows still in the engine are aborted and the next batch is submitted.

What differs from HF: the prompts are packed (varlen), not padded to the
longest, so the prefill computes no pad tokens -- this is the optimistic static
baseline; transformers' padded `generate` is measured beside it in notebook 05
(minillm.bench.hf_subject.HFSubject.serve).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from minillm.engine.llm_engine import LLMEngine
from minillm.sampling_params import SamplingParams


@dataclass
class StaticRun:
    outputs: dict[str, list[int]]  # request id -> its tokens, up to its own stop
    useful_tokens: int  # tokens the requests asked for (sum of the outputs' lengths)
    computed_tokens: int  # tokens the engine generated, finished rows' wasted decodes included
    steps: int
    engine_s: float  # the sum of the engine's step durations


def _own_stop(tokens: list[int], params: SamplingParams, eos: set[int]) -> int | None:
    """How many of `tokens` the request keeps under its own stop rules; None: not stopped yet."""
    for i, t in enumerate(tokens):
        if (not params.ignore_eos and t in eos) or t in params.stop_token_ids:
            return i + 1
        if i + 1 >= params.max_tokens:
            return i + 1
    return None


def run_static(engine: LLMEngine, requests: list[tuple[str, str | list[int], SamplingParams]],
               batch_size: int) -> StaticRun:
    """Serve `requests` (id, prompt, params) in arrival order, `batch_size` at a time, statically."""
    if engine.config.max_num_seqs < batch_size:
        raise ValueError(f"the engine seats {engine.config.max_num_seqs} sequences, the batch is {batch_size}")
    for rid, _, p in requests:
        if p.n != 1 or p.stop or p.min_tokens:
            raise ValueError(f"{rid}: static mode supports n=1 without stop strings or min_tokens")
    engine.executor.attach()  # this engine's KV pool, in case another engine used the model since
    first_step = len(engine.trace)
    outputs: dict[str, list[int]] = {}
    computed = 0
    for b in range(0, len(requests), batch_size):
        batch = requests[b : b + batch_size]
        horizon = max(p.max_tokens for _, _, p in batch)
        for rid, prompt, p in batch:  # every row decodes to the longest row's length
            engine.add_request(rid, prompt, replace(p, max_tokens=horizon, ignore_eos=True, stop_token_ids=[]))
        own = {rid: p for rid, _, p in batch}
        streams: dict[str, list[int]] = {rid: [] for rid in own}
        while len(outputs) - b < len(batch):
            for out in engine.step():
                streams[out.request_id] = list(out.outputs[0].token_ids)
            for rid, toks in streams.items():
                if rid not in outputs:
                    keep = _own_stop(toks, own[rid], engine.eos_token_ids)
                    if keep is not None:
                        outputs[rid] = toks[:keep]
        computed += sum(len(t) for t in streams.values())
        for rid in own:  # the batch is done: rows still decoding (nobody wants their tokens) leave
            engine.abort_request(rid)
    trace = engine.trace[first_step:]
    return StaticRun(outputs, sum(len(t) for t in outputs.values()), computed, len(trace),
                     sum(r.duration_s for r in trace))
