"""After the forward: turn the step's logits into each sequence's next tokens.

Chunks without drafts are sampled together (engine/sampler.py). Chunks that
carry drafts are verified by exact rejection sampling (spec_decode/rejection.py):
the accepted drafts plus one token of the target's own; a tree of drafts keeps
one root-to-node path (its nodes in ChosenTokens.accepted_nodes). Both give a
ChosenTokens, so the scheduler's update does not care which path chose them.
Until a sequence has min_tokens outputs, EOS and its stop token ids are banned
from every row that scores one of those outputs; a sequence with structured
outputs has every token its grammar forbids masked on each such row
(engine/grammar.py), and its grammar moves on over the tokens chosen.
"""
from __future__ import annotations

import torch

from typing import TYPE_CHECKING

from minillm.engine.batch import ScheduledBatch, StepBatch
from minillm.engine.sampler import Argmax, ban_tokens, logprob_entry, min_tokens_bans, sample
from minillm.engine.scheduler import ChosenTokens

if TYPE_CHECKING:
    from minillm.engine.grammar import MaskStats


def tree_depths(parents: list[int]) -> list[int]:
    from minillm.spec_decode.tree import node_depths  # a tree of drafts (spec_decode/tree.py)

    return node_depths(parents)


def _bans(batch: ScheduledBatch, step: StepBatch, eos_token_ids: set[int]) -> list[list[int]] | None:
    """Per logits row, the token ids it may not choose (None: no row has any)."""
    if all(c.seq.num_output_tokens >= c.seq.params.min_tokens for c in batch.chunks):
        return None  # the usual case: nothing to mask, no per-row work
    bans: list[list[int]] = [[] for _ in step.logit_rows]
    for c, (first, count) in zip(batch.chunks, step.chunk_logits):
        # row j scores output token num_output_tokens + j (a tree's row 1 + node: + the node's depth)
        ahead = list(range(count)) if c.draft_parents is None else [0] + tree_depths(c.draft_parents)
        for j in range(count):
            bans[first + j] = min_tokens_bans(c.seq.params, c.seq.num_output_tokens + ahead[j], eos_token_ids)
    return bans


def choose_tokens(batch: ScheduledBatch, step: StepBatch, logits: torch.Tensor | None, eos_token_ids: set[int],
                  fast_argmax: Argmax | None = None) -> tuple[list[ChosenTokens | None], "MaskStats | None"]:
    """chosen[i]: chunk i's tokens, or None when the chunk did not catch its sequence up; and what the
    structured-output masks cost this step (None: no sequence in the step has a grammar)."""
    chosen: list[ChosenTokens | None] = [None] * len(batch.chunks)
    if logits is None:
        return chosen, None
    bans = _bans(batch, step, eos_token_ids)
    if bans is not None:
        logits = ban_tokens(logits.clone(), bans)
    grammar, masks = None, None
    if any(c.seq.grammar is not None for c in batch.chunks):  # structured outputs, loaded with the first grammar
        from minillm.engine import grammar
        logits, masks = grammar.mask_logits(batch, step, logits)
    plain = [i for i, (c, (_, n)) in enumerate(zip(batch.chunks, step.chunk_logits)) if n and not c.draft_token_ids]
    if plain:
        rows = [step.chunk_logits[i][0] for i in plain]
        plain_logits = logits if len(rows) == logits.shape[0] else logits[torch.tensor(rows, device=logits.device)]
        seqs = [batch.chunks[i].seq for i in plain]
        res = sample(plain_logits, [s.params for s in seqs], [s.generator for s in seqs], fast_argmax)
        for j, i in enumerate(plain):
            chosen[i] = ChosenTokens([res.token_ids[j]], [res.logprobs[j]])
    drafted = [i for i, c in enumerate(batch.chunks) if step.chunk_logits[i][1] and c.draft_token_ids]
    if drafted:  # speculative decoding's verifier, loaded with the first drafts it checks
        from minillm.spec_decode.rejection import verify_tokens, verify_tree
    for i in drafted:
        c = batch.chunks[i]
        first, n = step.chunk_logits[i]
        rows = logits[first:first + n]  # row j scores the token after draft[:j]
        p = c.seq.params
        path = None
        if c.draft_parents is None:
            tokens, accepted = verify_tokens(rows, c.draft_token_ids, c.draft_probs, p, c.seq.generator)
            scored_by = list(range(len(tokens)))  # row j scored emitted token j
        else:  # a tree: one root-to-node path is accepted (spec_decode/tree.py)
            tokens, path = verify_tree(rows, c.draft_token_ids, c.draft_parents, p, c.seq.generator)
            accepted = len(path)
            scored_by = [0] + [1 + node for node in path]
        lps: list[dict[int, float] | None] = [None] * len(tokens)
        if p.logprobs is not None:
            lp = rows[scored_by].log_softmax(-1)
            lps = [logprob_entry(lp[j], t, p.logprobs) for j, t in enumerate(tokens)]
        chosen[i] = ChosenTokens(tokens, lps, accepted, path)
    if grammar is not None:
        grammar.advance(batch, chosen)
    return chosen, masks
