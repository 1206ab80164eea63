"""View model of the scheduler's lanes: per step, which requests wait in which lane and which run.

Every StepTrace carries the queues after the step (`StepTrace.queue`, in the
policy's admission order) and the policy's name. A lane is what the policy
orders by (engine/policy.py): under "length-aware" the short and the long lane,
under "priority" each priority value (lower first), under "fcfs" the one queue.

What a reader should see: at the cursor step, each lane's waiting requests in
the order they will be offered (the head first) beside the requests holding
seats; over all steps, how many wait and run in each lane, against
max_num_seqs. `head_waits` says, for every request that reached the head of
its lane, when it got there and when it was admitted -- the quantity the
length-aware policy's starvation bound is about. Pure functions of the trace.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from minillm.engine.trace import StepTrace
from minillm.visualize.trace_index import clamp_step, seq_infos


@dataclass(frozen=True)
class LaneEntry:
    seq_id: int
    request_id: str
    lane: str
    priority: int
    running: bool
    position: int  # waiting: place in its lane (0 = offered next); running: index among its lane's seats
    arrival_step: int  # the step whose record reports its arrival
    head_since: int | None  # the head of its lane: the first step it began at the head (None: not the head)


@dataclass(frozen=True)
class LaneCounts:
    step: int
    waiting: tuple[int, ...]  # per lane, in LanesView.lanes order
    running: tuple[int, ...]


@dataclass(frozen=True)
class LanesView:
    step: int
    policy: str
    lanes: tuple[str, ...]  # display order: the lane served first on top
    entries: tuple[LaneEntry, ...]  # after the cursor step
    counts: tuple[LaneCounts, ...]  # every step of the trace
    max_num_seqs: int

    def waiting(self, lane: str) -> list[LaneEntry]:
        return sorted((e for e in self.entries if e.lane == lane and not e.running), key=lambda e: e.position)

    def running(self, lane: str) -> list[LaneEntry]:
        return sorted((e for e in self.entries if e.lane == lane and e.running), key=lambda e: e.position)


@dataclass(frozen=True)
class HeadWait:
    seq_id: int
    request_id: str
    lane: str
    head_step: int  # the first step that began with it at the head of its lane
    admitted_step: int | None  # the first step that scheduled it (None: never, within the trace)

    @property
    def waited(self) -> int | None:
        """Steps from reaching the head to admission (0: admitted in the step it became the head)."""
        return None if self.admitted_step is None else self.admitted_step - self.head_step


def lane_name(policy: str, lane: str, priority: int) -> str:
    """The lane a queue entry is in, as its policy orders them."""
    if policy == "length-aware":
        return lane
    if policy == "priority":
        return f"priority {priority}"
    return "queue"


def _lane_order(policy: str, names: set[str]) -> tuple[str, ...]:
    if policy == "length-aware":  # short requests are offered first
        return tuple(n for n in ("short", "long") if n in names) + tuple(sorted(names - {"short", "long"}))
    if policy == "priority":
        return tuple(sorted(names, key=lambda n: int(n.split()[-1])))
    return tuple(sorted(names))


def _waiting_at_start(trace: Sequence[StepTrace], j: int) -> list[tuple[int, str, str]]:
    """(seq_id, request_id, lane) waiting when step j began: the queue after step j - 1, then step j's arrivals.

    Within a lane that is the order the policy offers them: arrivals join the back of their lane under
    every policy (priority ties go by arrival), and a preempted sequence's place is in the queue already.
    Siblings of an n > 1 request wait parked, outside the queue: only its first sequence is counted."""
    pol = trace[j].scheduling_policy
    before = [(q.seq_id, q.request_id, lane_name(pol, q.lane, q.priority))
              for q in (trace[j - 1].queue if j > 0 else ()) if not q.running]
    return before + [(a.seq_ids[0], a.request_id, lane_name(pol, a.lane, a.priority))
                     for a in trace[j].arrivals if a.seq_ids]


def head_waits(trace: Sequence[StepTrace], lane: str | None = None) -> list[HeadWait]:
    """Every sequence that began a step at the head of its lane (of `lane` only, if given), in that order.

    A sequence admitted in the same step as the head before it never was the head itself (the policy
    counts the same way: its clock starts when a step begins with the sequence at the head)."""
    admitted: dict[int, int] = {}
    for j, rec in enumerate(trace):
        for s in rec.scheduled:
            admitted.setdefault(s.seq_id, j)
    heads: dict[int, HeadWait] = {}
    for j in range(len(trace)):
        seen: set[str] = set()
        for sid, rid, name in _waiting_at_start(trace, j):
            if name in seen:
                continue
            seen.add(name)
            # a sequence preempted after admission can head its lane again: count its first time only
            if sid not in heads and (lane is None or name == lane) and admitted.get(sid, j) >= j:
                heads[sid] = HeadWait(sid, rid, name, j, admitted.get(sid))
    return sorted(heads.values(), key=lambda h: (h.head_step, h.seq_id))


def lanes_view(trace: Sequence[StepTrace], step: int | None = None) -> LanesView:
    """The lanes after `step` (default: the last), with every step's counts."""
    cur = clamp_step(trace, step)
    pol = trace[cur].scheduling_policy
    names = {lane_name(r.scheduling_policy, q.lane, q.priority) for r in trace for q in r.queue}
    lanes = _lane_order(pol, names or {lane_name(pol, "", 0)})
    counts = []
    for i, rec in enumerate(trace):
        w, r = [0] * len(lanes), [0] * len(lanes)
        for q in rec.queue:
            (r if q.running else w)[lanes.index(lane_name(rec.scheduling_policy, q.lane, q.priority))] += 1
        counts.append(LaneCounts(i, tuple(w), tuple(r)))
    infos = seq_infos(trace, cur)
    # when each lane's head got there (its first time); one that became the head during the cursor
    # step begins the next step at the head
    since = {h.seq_id: h.head_step for h in head_waits(trace[: cur + 1])}
    entries: list[LaneEntry] = []
    seen: dict[tuple[str, bool], int] = {}
    for q in trace[cur].queue:
        lane = lane_name(pol, q.lane, q.priority)
        k = seen.get((lane, q.running), 0)
        seen[(lane, q.running)] = k + 1
        head = since.get(q.seq_id, cur + 1) if (not q.running and k == 0) else None
        info = infos.get(q.seq_id)
        entries.append(LaneEntry(q.seq_id, q.request_id, lane, q.priority, q.running, k,
                                 info.arrival_step if info else cur, head))
    return LanesView(cur, pol, lanes, tuple(entries), tuple(counts), trace[cur].max_num_seqs)
