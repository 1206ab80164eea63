"""The step's batch: what the scheduler chose, what the proposer added, and the packed rows every rank runs.

Three stages fill one step's batch, and each field says which:

    ScheduledBatch   scheduler: one ScheduledChunk per sequence (its new tokens, lookahead slots)
                     proposer (speculative decoding only): draft tokens on the chunks that hold lookahead
    StepBatch        built from the chunks once, for every kind of step (prefill chunks, decodes,
                     speculative verification, tensor- or pipeline-parallel ranks): plain lists, so
                     rank 0 can broadcast it, turned into tensors and attention metadata by the executor

Packing rule (see attention/metadata.py): rows of sequences with exactly one query token come
first (the backends batch decodes together), then every longer query (prefill chunks, and
decodes that carry drafts: 1 + k query tokens). The step asks for logits at the last row of
every chunk that catches its sequence up, and at each of its draft rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minillm.attention.metadata import AttentionMetadata
from minillm.engine.sequence import Sequence


@dataclass
class ScheduledChunk:
    # --- filled by the scheduler -----------------------------------------------------------
    seq: Sequence
    num_new_tokens: int  # tokens of the sequence computed this step (a prefill chunk, or 1)
    num_computed_before: int  # tokens already in the KV cache (prefix hits included)
    num_prefix_hit_tokens: int = 0  # taken from the prefix cache when admitted this step
    num_lookahead: int = 0  # speculative decoding: budget and KV slots reserved for draft tokens
    # --- filled by the proposer (speculative decoding) ---------------------------------------
    draft_token_ids: list[int] = field(default_factory=list)  # at most num_lookahead guesses
    draft_probs: torch.Tensor | None = None  # [len(drafts), V] the q they were drawn from; None: deterministic
    draft_parents: list[int] | None = None  # a tree of drafts (spec_decode/tree.py): each one's parent; None: a chain

    @property
    def completes(self) -> bool:
        """After this chunk the sequence has caught up and the step samples its next token."""
        return self.num_computed_before + self.num_new_tokens == self.seq.num_tokens

    @property
    def num_query_tokens(self) -> int:
        """Rows this chunk adds to the forward: its new tokens plus its drafts."""
        return self.num_new_tokens + len(self.draft_token_ids)


@dataclass
class PreemptionRecord:
    seq: Sequence
    reason: str
    num_blocks_freed: int
    num_tokens_lost: int


@dataclass
class ScheduledBatch:
    """The scheduler's answer for one step (decodes first, then longer chunks)."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[PreemptionRecord] = field(default_factory=list)


@dataclass
class StepBatch:
    """One step packed for the model: the same on every rank."""

    token_ids: list[int]
    positions: list[int]
    query_lens: list[int]  # per packed sequence
    seq_lens: list[int]  # keys per packed sequence after this step
    block_tables: list[list[int]]
    logit_rows: list[int]  # packed rows whose logits the step needs, grouped by chunk
    # chunk i (in the scheduler's order) -> (first index into logit_rows, count); count 0: nothing sampled
    chunk_logits: list[tuple[int, int]]
    # per packed sequence: its draft tree's parents (its last 1 + N rows are the root and the nodes), or None
    tree_parents: list[list[int] | None] = field(default_factory=list)
    # chunk i (in the scheduler's order) -> its first packed row (EAGLE's layer reads every kept row)
    chunk_first_row: list[int] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def is_decode_only(self) -> bool:
        """Every sequence has exactly one query token (the shape torch.compile'd decode serves)."""
        return all(q == 1 for q in self.query_lens)

    @classmethod
    def build(cls, chunks: list[ScheduledChunk]) -> "StepBatch":
        order = [i for i, c in enumerate(chunks) if c.num_query_tokens == 1]
        order += [i for i, c in enumerate(chunks) if c.num_query_tokens != 1]
        b = cls([], [], [], [], [], [], [(0, 0)] * len(chunks), [], [0] * len(chunks))
        rows_of: dict[int, list[int]] = {}
        for i in order:
            c = chunks[i]
            start, end = c.num_computed_before, c.num_computed_before + c.num_new_tokens
            drafts = c.draft_token_ids
            b.chunk_first_row[i] = len(b.token_ids)
            b.token_ids.extend(c.seq.token_ids[start:end])
            b.token_ids.extend(drafts)
            b.positions.extend(range(start, end))
            if c.draft_parents is None:
                b.positions.extend(range(end, end + len(drafts)))
            else:  # a tree node sits at the root's position plus its depth; its slot is its list index
                from minillm.spec_decode.tree import node_depths

                b.positions.extend(end - 1 + d for d in node_depths(c.draft_parents))
            b.tree_parents.append(c.draft_parents)
            b.query_lens.append(end - start + len(drafts))
            b.seq_lens.append(end + len(drafts))
            b.block_tables.append(list(c.seq.block_table))
            if c.completes:  # the last new token scores the next one; each draft row scores the one after it
                last = len(b.token_ids) - 1 - len(drafts)
                rows_of[i] = list(range(last, last + 1 + len(drafts)))
        for i in range(len(chunks)):  # logits come back in the scheduler's chunk order
            rows = rows_of.get(i, [])
            b.chunk_logits[i] = (len(b.logit_rows), len(rows))
            b.logit_rows.extend(rows)
        return b

    def attention_metadata(self, block_size: int, device: torch.device) -> AttentionMetadata:
        trees = self.tree_parents if any(t is not None for t in self.tree_parents) else None
        return AttentionMetadata.build(self.query_lens, self.seq_lens, self.block_tables, block_size, device, trees)
