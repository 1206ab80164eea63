"""Scheduling policies: who waits first, who is preempted first, and the short-request lane.

The scheduler (engine/scheduler.py) keeps one mechanism -- serve running
sequences first, then admit waiting ones while budget, seats and blocks last,
and preempt from the back of the running list when the pool is full. A policy
only decides three orders:

- where a sequence goes in the waiting queue (`enqueue`), and which one is
  offered for admission next (`next_waiting`; None stops admission this step);
- the order of the running list (`order_running`): its back is preempted first;
- for the length-aware policy, which lane a sequence is in and how many seats a lane may hold.

The policies (EngineConfig.scheduling_policy):

    "fcfs"          first come, first served (the default; minillm's behaviour before policies existed).
                    The most recently admitted running sequence is preempted first.
    "priority"      vLLM's priority policy: the waiting queue is ordered by (priority, arrival) -- a
                    *lower* value is served first -- and the lowest-priority running sequence (largest
                    value, latest arrival among ties) is preempted first. As in vLLM's V1 scheduler a
                    waiting request never preempts a running one: it takes the next seat that frees,
                    ahead of every lower-priority request (preempting for it would throw computed
                    K/V away and can thrash).
    "length-aware"  two lanes by expected work, prompt + max_tokens: short (<= short_lane_max_tokens)
                    and long. Short requests are offered first and long requests may hold at most
                    max_num_seqs - reserved seats, so a short chat never waits for a long generation
                    to finish. Starvation bound: once a long request has been at the head of its lane
                    for long_lane_max_wait_steps steps, nothing is admitted ahead of it until it is
                    admitted (short requests only into seats its lane could not use anyway) -- so it
                    waits at most that many steps plus the time for a seat within the long lane's
                    share, its blocks and its budget to free as running sequences finish: with budget
                    and blocks to spare, at most N + R - 1 steps at the head of its lane, R = the longest
                    max_tokens (a sequence holds its seat for max_tokens steps; tests/test_scheduling_policy.py).
                    Long sequences are preempted before short ones.

Within a policy's order admission is strict: when the next sequence does not fit, nothing behind
it is admitted that step (no lower-priority request jumps a higher one).
"""
from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from collections import deque

from minillm.engine.sequence import Sequence

SCHEDULING_POLICIES = ("fcfs", "priority", "length-aware")
SHORT, LONG = "short", "long"


def priority_key(seq: Sequence) -> tuple[int, float, int]:
    """vLLM's order: lower priority value first, then earlier arrival (seq_id breaks exact ties)."""
    return (seq.priority, seq.arrival_time, seq.seq_id)


class SchedulingPolicy(ABC):
    name: str

    def enqueue(self, waiting: deque[Sequence], seq: Sequence, front: bool = False) -> None:
        """Put seq in the waiting queue; front: a preempted sequence or a released n > 1 sibling."""
        if front:
            waiting.appendleft(seq)
        else:
            waiting.append(seq)

    def begin_step(self, waiting: deque[Sequence], running: list[Sequence]) -> None:
        """Called once at the start of every schedule(): the policy may reorder running (back = victim)."""

    @abstractmethod
    def next_waiting(self, waiting: deque[Sequence], running: list[Sequence]) -> Sequence | None:
        """The sequence to try to admit next, or None to admit nothing more this step."""

    def lane(self, seq: Sequence) -> str:
        """The lane shown in the trace ("" for policies without lanes)."""
        return ""


class FCFS(SchedulingPolicy):
    name = "fcfs"

    def next_waiting(self, waiting, running):
        return waiting[0] if waiting else None


class PriorityPolicy(SchedulingPolicy):
    name = "priority"

    def enqueue(self, waiting, seq, front=False):
        # kept sorted by priority_key; a preempted sequence keeps its arrival time, so it goes back
        # ahead of every later request of its priority (what FCFS's appendleft does for one class)
        keys = [priority_key(s) for s in waiting]
        waiting.insert(bisect.bisect_right(keys, priority_key(seq)), seq)

    def begin_step(self, waiting, running):
        running.sort(key=priority_key)  # the back -- largest value, latest arrival -- is preempted first

    def next_waiting(self, waiting, running):
        return waiting[0] if waiting else None


class LengthAwarePolicy(SchedulingPolicy):
    name = "length-aware"

    def __init__(self, max_num_seqs: int, short_lane_max_tokens: int, short_lane_share: float,
                 long_lane_max_wait_steps: int) -> None:
        self.short_lane_max_tokens = short_lane_max_tokens
        # seats the long lane may never take (at least one when share > 0, never all of them)
        reserved = max(1, math.ceil(short_lane_share * max_num_seqs)) if short_lane_share > 0 else 0
        self.reserved_seats = min(reserved, max_num_seqs - 1)
        self.long_lane_seats = max_num_seqs - self.reserved_seats
        self.long_lane_max_wait_steps = long_lane_max_wait_steps
        self.step = 0
        self._head: Sequence | None = None  # the long lane's head, and the step it became head
        self._head_since = 0

    def lane(self, seq: Sequence) -> str:
        return SHORT if seq.num_prompt_tokens + seq.max_tokens <= self.short_lane_max_tokens else LONG

    def begin_step(self, waiting, running):
        self.step += 1
        head = next((s for s in waiting if self.lane(s) == LONG), None)
        if head is not self._head:
            self._head, self._head_since = head, self.step
        running.sort(key=lambda s: self.lane(s) == LONG)  # stable: long ones at the back, preempted first

    def long_head_waited(self) -> int:
        """Steps the long lane's current head has been at the head (0 when there is none)."""
        return self.step - self._head_since if self._head is not None else 0

    def next_waiting(self, waiting, running):
        short = next((s for s in waiting if self.lane(s) == SHORT), None)
        long_ = next((s for s in waiting if self.lane(s) == LONG), None)
        aged = long_ is not None and long_ is self._head and self.long_head_waited() >= self.long_lane_max_wait_steps
        long_ok = long_ is not None and sum(self.lane(s) == LONG for s in running) < self.long_lane_seats
        if aged:  # the starvation bound: nothing goes ahead of it any more, except short requests
            # while the long lane's seats are all taken (they cannot take those from it)
            return long_ if long_ok else short
        if short is not None:
            return short
        return long_ if long_ok else None


def make_policy(name: str, max_num_seqs: int, short_lane_max_tokens: int = 256, short_lane_share: float = 0.25,
                long_lane_max_wait_steps: int = 64) -> SchedulingPolicy:
    if name == "fcfs":
        return FCFS()
    if name == "priority":
        return PriorityPolicy()
    if name == "length-aware":
        return LengthAwarePolicy(max_num_seqs, short_lane_max_tokens, short_lane_share, long_lane_max_wait_steps)
    raise ValueError(f"unknown scheduling_policy {name!r}; choose one of {SCHEDULING_POLICIES}")
