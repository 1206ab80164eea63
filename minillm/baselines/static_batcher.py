"""Static batching on the real engine: the baseline that continuous batching replaced.

Why it exists: notebook 05 compares continuous batching with the system it
replaced, run for real. A classic static server (Hugging Face `generate` on a
padded batch, FasterTransformer before Orca) takes B requests, left-pads their
prompts to the batch's longest, runs the batch until its LONGEST request has
finished, and only then takes the next B. A row whose own answer ended early
stays in the batch: its decode steps are computed and thrown away (HF keeps
generating pad tokens for it).

This driver does that on an LLMEngine, paying both wastes:

* Finished rows stay: each request of a batch is submitted with the batch's
  longest max_tokens and EOS ignored, so every row decodes until the longest is
  done; each row's own stop rule (its max_tokens, EOS, stop token ids) is
  applied to its output stream by the driver; then the rows still in the engine
  are aborted and the next batch is submitted.
* Padding is computed: the engine's paged attention has no per-key mask, so pad
  tokens cannot sit in front of a row's prompt without changing its tokens.
  Instead the batch's pad positions (B x longest prompt minus the prompt tokens)
  are prefilled as separate pad-token sequences in the same step as the rows,
  and finish there (one sampled token each, discarded). The rows' tokens are
  exactly the continuous engine's; the prefill computes B x longest-prompt
  positions through every linear layer, as a padded batch does. Each pad
  sequence is shorter than a KV block, so the prefix cache can never serve one.

What still differs from a padded `generate`, all small next to the linear
layers at these prompt lengths: a pad sequence attends to its own pad tokens
rather than being masked inside each row's Lmax x Lmax attention, and costs one
extra logit row; decode attention needs nothing added on the torch backend
(the CPU path), which already pads every decode row to the step's longest
context and masks the rest (the Triton kernel reads each row's own keys only).
The engine's prefix cache, when enabled, serves the rows of both policies alike.

Measured where: notebook 05 times this against the same engine's continuous
batching. HF `generate` itself is not measured there; it is the static peer of
`minillm bench throughput --compare transformers` (minillm.bench.hf_subject).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from minillm.engine.llm_engine import LLMEngine
from minillm.engine.request import encode_text
from minillm.sampling_params import SamplingParams

PAD_PREFIX = "<pad>"  # request ids of the pad sequences: f"{PAD_PREFIX}{batch}.{k}"


@dataclass
class StaticRun:
    outputs: dict[str, list[int]]  # request id -> its tokens, up to its own stop
    useful_tokens: int  # tokens the requests asked for (sum of the outputs' lengths)
    computed_tokens: int  # tokens the engine generated, finished rows' wasted decodes included
    pad_tokens: int  # pad positions prefilled: per batch, B x its longest prompt minus its prompt tokens
    computed_positions: int  # positions through the model: prompts, pads (prefix-cache hits not) and decodes
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


def _pad_token_id(engine: LLMEngine) -> int:
    """The tokenizer's pad token, else an EOS (HF's fallback), else 0: its value costs nothing different."""
    pad = getattr(engine.tokenizer, "pad_token_id", None)
    return pad if pad is not None else min(engine.eos_token_ids, default=0)


def _pad_pieces(num_pad: int, block_size: int) -> list[int]:
    """Lengths of the pad sequences carrying `num_pad` positions, each under one KV block (never cached)."""
    piece = max(1, block_size - 1)
    return [min(piece, num_pad - i) for i in range(0, num_pad, piece)]


def run_static(engine: LLMEngine, requests: list[tuple[str, str | list[int], SamplingParams]],
               batch_size: int) -> StaticRun:
    """Serve `requests` (id, prompt, params) in arrival order, `batch_size` at a time, statically.

    The engine must seat a batch plus its pad sequences in one step (max_num_seqs)."""
    for rid, _, p in requests:
        if p.n != 1 or p.stop or p.min_tokens:
            raise ValueError(f"{rid}: static mode supports n=1 without stop strings or min_tokens")
    # tokenized once, as the engine would, so the padding is counted on the ids the engine runs
    ids = {rid: list(pr) if not isinstance(pr, str) else encode_text(engine.tokenizer, pr)
           for rid, pr, _ in requests}
    batches = [requests[b : b + batch_size] for b in range(0, len(requests), batch_size)]
    pads = [_pad_pieces(sum(max(len(ids[r]) for r, _, _ in batch) - len(ids[r]) for r, _, _ in batch),
                        engine.block_manager.block_size) for batch in batches]
    seats = max((len(batch) + len(p) for batch, p in zip(batches, pads)), default=0)
    if engine.config.max_num_seqs < seats:
        raise ValueError(f"a batch of {batch_size} with its pad sequences needs {seats} seats; "
                         f"the engine seats {engine.config.max_num_seqs}")
    engine.executor.attach()  # this engine's KV pool, in case another engine used the model since
    first_step = len(engine.trace)
    pad_id = _pad_token_id(engine)
    pad_params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    outputs: dict[str, list[int]] = {}
    computed = 0
    for n, (batch, pieces) in enumerate(zip(batches, pads)):
        horizon = max(p.max_tokens for _, _, p in batch)
        for rid, _, p in batch:  # every row decodes to the longest row's length
            engine.add_request(rid, ids[rid], replace(p, max_tokens=horizon, ignore_eos=True, stop_token_ids=[]))
        pad_ids = [f"{PAD_PREFIX}{n}.{k}" for k in range(len(pieces))]
        for pid, length in zip(pad_ids, pieces):  # queued after the rows: prefilled in the rows' step, done there
            engine.add_request(pid, [pad_id] * length, pad_params)
        own = {rid: p for rid, _, p in batch}
        streams: dict[str, list[int]] = {rid: [] for rid in own}
        while any(rid not in outputs for rid in own) or any(pid in engine.requests for pid in pad_ids):
            for out in engine.step():
                if out.request_id in streams:
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
    return StaticRun(outputs, sum(len(t) for t in outputs.values()), computed, sum(sum(p) for p in pads),
                     sum(r.num_prefill_tokens + r.num_decode_tokens for r in trace), len(trace),
                     sum(r.duration_s for r in trace))
