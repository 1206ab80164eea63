"""Continuous batching with a per-step token budget.

One rule covers chunked prefill, prefix-cache hits and decode: every sequence
knows how many of its tokens are already in the KV cache
(`num_computed_tokens`); each step gives each scheduled sequence a chunk of
its remaining tokens, within a budget of `max_num_batched_tokens` tokens and
`max_num_seqs` sequences. A decode is simply a chunk of one token.

After the model ran, `update` does the step's bookkeeping: advance each
sequence's computed tokens, register full blocks in the prefix cache, append
the chosen tokens (stop checks live in Sequence.append_token), roll back
rejected speculative slots, and free finished sequences' blocks.

Running sequences are served first; when the pool has no block for one of
them, the sequence at the back of the running list is preempted (its blocks
are freed and it will be recomputed from scratch -- "preemption by recompute")
and goes back to the waiting queue. The order of both lists is the scheduling
policy's (engine/policy.py): first-come, first-served by default (the most
recently admitted sequence is preempted first), vLLM's priority order, or a
short-request lane.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minillm.engine.batch import PreemptionRecord, ScheduledBatch, ScheduledChunk
from minillm.engine.block_manager import BlockManager
from minillm.engine.config import EngineConfig
from minillm.engine.policy import make_policy
from minillm.engine.sequence import Sequence, SequenceStatus


def admit_within_budget(num_remaining: int, budget_left: int, seats_left: int, chunked_prefill: bool) -> int:
    """How many of a waiting sequence's remaining tokens to schedule this step; 0: it does not fit.

    The admission rule of the token budget: no seat or no budget left admits nothing; a prompt
    that fits whole goes whole; a longer one takes what is left of the budget when chunked prefill
    is on and waits (stopping admission, strict order) when it is off. The scheduler calls this
    module name, so minillm.exercises.use("learner") runs exercises/ex02_admission.py instead.
    """
    if seats_left <= 0 or budget_left <= 0:
        return 0
    if num_remaining <= budget_left:
        return num_remaining
    return budget_left if chunked_prefill else 0


@dataclass
class ChosenTokens:
    """What the sampler (or the speculative verifier) chose for one chunk that completed its sequence."""

    token_ids: list[int]  # accepted drafts, then one token of the target's own
    logprobs: list[dict[int, float] | None]
    num_accepted: int = 0  # leading draft tokens the target agreed with
    accepted_nodes: list[int] | None = None  # a tree's accepted path (node indices); None: a chain or no drafts


@dataclass
class StepUpdate:
    """What `update` did, for the outputs and the trace."""

    emitted: dict[int, list[int]] = field(default_factory=dict)  # seq_id -> tokens appended this step
    finished: list[Sequence] = field(default_factory=list)
    changed: list[Sequence] = field(default_factory=list)  # sequences whose output grew or ended


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, max_model_len: int,
                 eos_token_ids: set[int] | None = None) -> None:
        self.config = config
        self.bm = block_manager
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids or ())
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.parked: list[Sequence] = []  # n > 1 siblings waiting for the first one's prompt
        self.num_lookahead_slots = 0  # speculative decoding: k draft slots per decoding sequence
        self.policy = make_policy(config.scheduling_policy, config.max_num_seqs, config.short_lane_max_tokens,
                                  config.short_lane_share, config.long_lane_max_wait_steps)

    def add(self, seq: Sequence) -> None:
        if seq.wait_for_parent is not None:
            self.parked.append(seq)
        else:
            self.policy.enqueue(self.waiting, seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.parked)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.parked)

    def _lookahead(self, seq: Sequence, budget_left: int) -> int:
        """Draft slots worth reserving: none past the context length, none past max_tokens."""
        if not self.num_lookahead_slots or seq.num_uncomputed_tokens != 1:
            return 0
        left = seq.max_tokens - seq.num_output_tokens - 1  # the verify step emits one token of its own
        return max(0, min(self.num_lookahead_slots, budget_left, self.max_model_len - seq.num_tokens, left))

    # ----- before the model runs ---------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        out = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledChunk] = []
        self.policy.begin_step(self.waiting, self.running)  # it may reorder running: the back is the victim

        # 1. running sequences in the policy's order (fcfs: oldest first); preempt from the back when the pool is full
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            look = self._lookahead(seq, budget - n)
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

        # 2. waiting sequences in the policy's order (fcfs: arrival), while budget, seats and blocks last;
        # the first that does not fit stops admission. After a preemption no new sequence is admitted
        # this step (it would just be evicted again).
        while self.waiting and budget > 0 and not out.preempted and len(self.running) < self.config.max_num_seqs:
            seq = self.policy.next_waiting(self.waiting, self.running)
            if seq is None:
                break
            fresh = seq.num_computed_tokens == 0  # not a child that already shares its parent's blocks
            cached = self.bm.find_cached_prefix(seq) if fresh else []
            remaining = seq.num_tokens - seq.num_computed_tokens - len(cached) * self.bm.block_size
            n = admit_within_budget(remaining, budget, self.config.max_num_seqs - len(self.running),
                                    self.config.enable_chunked_prefill)
            if n <= 0:
                break
            if not self.bm.can_allocate(seq, n, cached):
                break
            if self.waiting[0] is seq:
                self.waiting.popleft()
            else:
                self.waiting.remove(seq)
            before_hits = seq.num_computed_tokens
            if fresh:
                self.bm.note_prefix_query(seq.num_tokens)
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

    def _preempt(self, seq: Sequence, out: ScheduledBatch, reason: str) -> None:
        self.running.remove(seq)
        nblocks, ntok = len(seq.block_table), seq.num_computed_tokens
        self.bm.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.policy.enqueue(self.waiting, seq, front=True)
        out.preempted.append(PreemptionRecord(seq, reason, nblocks, ntok))

    # ----- after the model ran -------------------------------------------------------------
    def update(self, batch: ScheduledBatch, chosen: list[ChosenTokens | None], start_time: float,
               now: float) -> StepUpdate:
        """Apply one step's results: chosen[i] is chunk i's tokens (None: a chunk that did not catch up)."""
        up = StepUpdate()
        for c, picked in zip(batch.chunks, chosen):
            seq = c.seq
            seq.num_computed_tokens += c.num_new_tokens
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = start_time
            self.bm.register_full_blocks(seq)
            if picked is None:
                continue
            # accepted drafts' K/V are valid cache now (their ids are appended below);
            # the last emitted token is not computed yet
            seq.num_computed_tokens += picked.num_accepted
            if c.num_lookahead:
                self.bm.trim(seq)  # give back the slots of rejected (or never proposed) drafts
            if seq.num_output_tokens == 0 and seq.index == 0:
                self.release_children(seq)
            emitted: list[int] = []
            for tok, lp in zip(picked.token_ids, picked.logprobs):
                emitted.append(tok)
                reason = seq.append_token(tok, lp, now, self.eos_token_ids, self.max_model_len)
                if reason is not None:
                    seq.finish_reason, seq.finish_time = reason, now
                    self.finish(seq)
                    up.finished.append(seq)
                    break
            if picked.num_accepted and not seq.is_finished:
                self.bm.register_full_blocks(seq)
            up.emitted[seq.seq_id] = emitted
            up.changed.append(seq)
        return up

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
            self.bm.share_prefix(child, parent, min(full, (child.num_tokens - 1) // self.bm.block_size))
            child.num_cached_tokens = child.num_computed_tokens
            self.policy.enqueue(self.waiting, child, front=True)

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
