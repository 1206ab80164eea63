"""One engine step with speculation: schedule, propose, verify, accept, roll back, record.

LLMEngine.step hands over to `spec_step` when a speculative config is set;
the plain path stays untouched. Per decoding sequence the scheduler reserved
k + 1 slots of budget and KV (its "lookahead"); here the proposer fills up to
k of them, the runner scores all positions in one forward, and the verifier
keeps the accepted prefix plus one target token. Tokens go through the
engine's usual `_append_token` one at a time, so eos / stop strings /
max_tokens can end a run in the middle of an accepted stretch. Blocks past
the accepted length are returned to the pool.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from minillm.engine import trace as tr
from minillm.engine.cost import step_cost
from minillm.engine.outputs import RequestOutput
from minillm.engine.sampler import sample
from minillm.spec.config import SpecConfig
from minillm.spec.proposal import Proposal
from minillm.spec.rejection import verify_tokens


def make_proposer(cfg: SpecConfig, engine):
    if cfg.method == "ngram":
        from minillm.spec.ngram import NgramProposer

        return NgramProposer(cfg.ngram_max, cfg.ngram_min)
    from minillm.spec.draft import DraftProposer, quantized_copy

    n = engine.model.config.num_hidden_layers
    cfg.validate(n)
    draft = engine.model if cfg.model == "self" else quantized_copy(engine.model, cfg.model)
    return DraftProposer(engine.model, draft, tuple(range(cfg.num_layers or n)), engine.block_manager.block_size)


def set_num_tokens(engine, k: int) -> None:
    """Change k on an idle engine (benchmarks sweep it); the proposer and its draft are kept."""
    if engine.spec is None:
        raise ValueError("this engine has no speculative config")
    if engine.has_unfinished_requests():
        raise ValueError("change num_tokens between runs, not while requests are in flight")
    cfg = dataclasses.replace(engine.spec, num_tokens=k)
    cfg.validate()
    engine.spec = cfg
    engine.scheduler.num_lookahead_slots = k


def _max_drafts(engine, chunk) -> int:
    """Lookahead actually worth proposing: no position past the context, no token past max_tokens."""
    seq = chunk.seq
    left = engine.requests[seq.request_id].max_tokens - seq.num_output_tokens  # tokens it may still emit
    return max(0, min(chunk.num_lookahead, engine.max_model_len - seq.num_tokens, left - 1))


def _logprob_entry(lp_row: torch.Tensor, token: int, k: int) -> dict[int, float]:
    entry = {token: float(lp_row[token])}
    if k:
        vals, ids = lp_row.topk(k)
        for v, t in zip(vals.tolist(), ids.tolist()):
            entry.setdefault(t, v)
    return entry


def spec_step(engine) -> list[RequestOutput]:
    t0 = time.perf_counter()
    sched = engine.scheduler.schedule()
    chunks = sched.chunks
    # 1. propose for every chunk that holds lookahead slots
    wants = [(i, c.seq, _max_drafts(engine, c)) for i, c in enumerate(chunks) if c.num_lookahead > 0]
    proposals: dict[int, Proposal] = {}
    if wants:
        engine.runner.attach()
        for (i, _, _), prop in zip(wants, engine.proposer.propose([(s, k) for _, s, k in wants])):
            proposals[i] = prop
    drafts = [proposals[i].token_ids if i in proposals else [] for i in range(len(chunks))]
    # 2. one target forward over every chunk plus its drafts
    logits = engine.runner.run_verify(chunks, drafts) if chunks else []
    # plain completions (no drafts) are sampled together, exactly as the normal path does
    plain = [i for i, c in enumerate(chunks) if c.completes and not drafts[i]]
    plain_res = sample(torch.cat([logits[i][:1] for i in plain]), [chunks[i].seq.params for i in plain],
                       [chunks[i].seq.generator for i in plain]) if plain else None
    plain_at = {i: j for j, i in enumerate(plain)}
    now = time.perf_counter()
    bm = engine.block_manager
    changed = {}
    new_tokens: list[tr.NewTokens] = []
    sampled_flags: list[bool] = []
    records: list[tr.SpecRecord] = []
    for i, c in enumerate(chunks):
        seq = c.seq
        seq.num_computed_tokens += c.num_new_tokens
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = t0
        bm.register_full_blocks(seq)
        sampled_flags.append(c.completes)
        if not c.completes:
            bm.trim(seq)
            continue
        d = drafts[i]
        if d:
            prop = proposals[i]
            tokens, n_acc = verify_tokens(logits[i], d, prop.q(), seq.params, seq.generator)
            lps = [None] * len(tokens)
            if seq.params.logprobs is not None:
                lp = logits[i][: len(tokens)].log_softmax(-1)
                lps = [_logprob_entry(lp[j], t, seq.params.logprobs) for j, t in enumerate(tokens)]
        else:
            j = plain_at[i]
            tokens, n_acc, lps = [plain_res.token_ids[j]], 0, [plain_res.logprobs[j]]
        # the accepted drafts' K/V are now valid cache; the last emitted token is not computed yet
        seq.num_computed_tokens += n_acc
        bm.trim(seq)
        if seq.num_output_tokens == 0 and seq.index == 0:
            engine.scheduler.release_children(seq)
        emitted: list[int] = []
        for tok, lp in zip(tokens, lps):
            engine._append_token(seq, tok, lp, now)
            emitted.append(tok)
            if seq.is_finished:
                break
        if not seq.is_finished:
            bm.register_full_blocks(seq)
        if c.num_lookahead > 0:
            records.append(tr.SpecRecord(seq.seq_id, len(d), n_acc, tuple(d), len(emitted),
                                         bool(d) and n_acc == len(d)))
        new_tokens.append(tr.NewTokens(seq.seq_id, tuple(emitted)))
        changed[seq.request_id] = engine.requests[seq.request_id]
    engine._record(t0, time.perf_counter(), sched, sampled_flags, new_tokens)
    _annotate(engine, chunks, drafts, records)
    outputs = [engine._make_output(r) for r in changed.values()]
    for out in outputs:
        if out.finished:
            engine.requests.pop(out.request_id, None)
    return outputs


def _annotate(engine, chunks, drafts: list[list[int]], records: list[tr.SpecRecord]) -> None:
    """Rewrite the step's record: verify phases, spec token counts, the cost of the drafts' rows."""
    rec = engine.trace[-1]
    scheduled = tuple(
        dataclasses.replace(s, phase="verify", num_new_tokens=s.num_new_tokens + len(d), context_len=s.context_len + len(d))
        if d else s
        for s, d in zip(rec.scheduled, drafts)
    )
    n_spec = sum(len(d) for d in drafts)
    cost = step_cost(
        engine.model.config,
        [(c.num_new_tokens + len(d), c.num_computed_before + c.num_new_tokens + len(d)) for c, d in zip(chunks, drafts)],
        sum(1 + len(d) for c, d in zip(chunks, drafts) if c.completes),
        engine._weight_bytes_per_param, engine._kv_elem_bytes,
    ) if chunks else None
    engine.trace[-1] = dataclasses.replace(
        rec, scheduled=scheduled, num_spec_tokens=n_spec, spec=tuple(records),
        flops=cost.flops if cost else 0.0, bytes_moved=cost.bytes_moved if cost else 0.0,
        weight_bytes=cost.weight_bytes if cost else 0.0,
        kv_read_bytes=cost.kv_read_bytes if cost else 0.0, kv_write_bytes=cost.kv_write_bytes if cost else 0.0,
    )
