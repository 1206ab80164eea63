"""Continuous batching with a per-step token budget.

One rule covers chunked prefill, prefix-cache hits and decode: every sequence
knows how many of its tokens are already in the KV cache
(`num_computed_tokens`); each step gives each scheduled sequence a chunk of
its remaining tokens, within a budget of `max_num_batched_tokens` tokens and
`max_num_seqs` sequences. A decode is simply a chunk of one token.

Order is first-come, first-served. Running sequences are served first; when
the pool has no block for one of them, the most recently admitted running
sequence is preempted (its blocks are freed and it will be recomputed from
scratch -- "preemption by recompute") and goes back to the front of the queue.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minillm.config import SchedulerConfig
from minillm.engine.block_manager import BlockManager
from minillm.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledChunk:
    seq: Sequence
    num_new_tokens: int
    num_computed_before: int
    num_prefix_hit_tokens: int = 0  # taken from the prefix cache when admitted this step
    num_lookahead: int = 0  # speculative decoding: extra slots (budget and KV) for draft tokens

    @property
    def completes(self) -> bool:
        """After this chunk the sequence has caught up and the step samples its next token."""
        return self.num_computed_before + self.num_new_tokens == self.seq.num_tokens


@dataclass
class PreemptionRecord:
    seq: Sequence
    reason: str
    num_blocks_freed: int
    num_tokens_lost: int


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)  # decodes first, then longer chunks
    preempted: list[PreemptionRecord] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.bm = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.parked: list[Sequence] = []  # n > 1 siblings waiting for the first one's prompt
        self.num_lookahead_slots = 0  # speculative decoding: k draft slots per decoding sequence

    def add(self, seq: Sequence) -> None:
        if seq.wait_for_parent is not None:
            self.parked.append(seq)
        else:
            self.waiting.append(seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.parked)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledChunk] = []

        # 1. running sequences, oldest first; preempt from the back when the pool is full
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            look = min(self.num_lookahead_slots, budget - n) if seq.num_uncomputed_tokens == 1 else 0
            if look and not self.bm.can_allocate(seq, n + look):
                look = 0  # a tight pool: decode plainly rather than preempt for a guess
            while not self.bm.can_allocate(seq, n + look):
                victim = self.running[-1]
                self._preempt(victim, out, f"kv_pool_full: no free block for seq {seq.seq_id} "
                              f"({self.bm.num_free_blocks} free of {self.bm.num_blocks})")
                if victim is seq:
                    break
            else:
                self.bm.allocate(seq, n + look)
                scheduled.append(ScheduledChunk(seq, n, seq.num_computed_tokens, num_lookahead=look))
                budget -= n + look
                i += 1
                continue
            # seq itself was preempted; the list shrank, keep index

        # 2. waiting sequences in arrival order, while budget, seats and blocks last.
        # After a preemption no new sequence is admitted this step (it would just be evicted again).
        while self.waiting and budget > 0 and not out.preempted and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            fresh = seq.num_computed_tokens == 0  # not a child that already shares its parent's blocks
            cached = self.bm.find_cached_prefix(seq) if fresh else []
            remaining = seq.num_tokens - seq.num_computed_tokens - len(cached) * self.bm.block_size
            if not self.config.enable_chunked_prefill and remaining > budget:
                break
            n = min(remaining, budget)
            if not self.bm.can_allocate(seq, n, cached):
                break
            self.waiting.popleft()
            before_hits = seq.num_computed_tokens
            if fresh and self.bm.enable_prefix_caching:
                self.bm.events.queried_tokens += seq.num_tokens
            if cached:
                self.bm.take_cached_prefix(seq, cached)
            if seq.first_scheduled_time is None:
                seq.num_cached_tokens = seq.num_computed_tokens
            self.bm.allocate(seq, n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledChunk(seq, n, seq.num_computed_tokens, seq.num_computed_tokens - before_hits))
            budget -= n

        # decodes (one new token) first: the attention backends batch them together
        out.chunks = [c for c in scheduled if c.num_new_tokens == 1] + [c for c in scheduled if c.num_new_tokens != 1]
        return out

    def _preempt(self, seq: Sequence, out: SchedulerOutput, reason: str) -> None:
        self.running.remove(seq)
        nblocks, ntok = len(seq.block_table), seq.num_computed_tokens
        self.bm.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(PreemptionRecord(seq, reason, nblocks, ntok))

    def release_children(self, parent: Sequence) -> None:
        """The parent's prompt is cached: its n-1 siblings may start and share those blocks."""
        ready = [s for s in self.parked if s.wait_for_parent is parent]
        if not ready:
            return
        self.parked = [s for s in self.parked if s.wait_for_parent is not parent]
        full = parent.num_prompt_tokens // self.bm.block_size
        for child in reversed(ready):
            child.wait_for_parent = None
            # Share the parent's full prompt blocks directly (works with prefix caching off too);
            # the partial last block is recomputed by the child's own short prefill.
            take = min(full, (child.num_tokens - 1) // self.bm.block_size)
            for bid in parent.block_table[:take]:
                self.bm.blocks[bid].ref_count += 1
                self.bm.events.shared.append(bid)
            child.block_table = list(parent.block_table[:take])
            child.block_hashes = list(parent.block_hashes[:take])
            child.num_computed_tokens = take * self.bm.block_size
            child.num_cached_tokens = child.num_computed_tokens
            self.waiting.appendleft(child)

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        self.bm.free(seq)
        seq.status = SequenceStatus.FINISHED

    def abort(self, seq: Sequence) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.parked:
            self.parked.remove(seq)
        self.finish(seq)
