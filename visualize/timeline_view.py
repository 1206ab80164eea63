"""View model of the batch over time: sequences x steps, and each step's token mix.

Each cell says what a sequence did in a step: waited in the queue, ran a
prefill chunk, decoded one token, verified speculative tokens, held its KV
blocks without being scheduled (the token budget ran out), was preempted, or
finished. Below it, each step's prefill / decode / speculative token counts
against the token budget show how full the batch was.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Sequence

from minillm.engine.trace import StepTrace
from minillm.visualize.trace_index import clamp_step, seq_infos


class SeqState(IntEnum):
    WAITING = 0
    PREFILL = 1
    DECODE = 2
    VERIFY = 3
    STALLED = 4  # holds KV blocks but got no tokens this step
    PREEMPTED = 5
    FINISHED = 6  # finished (e.g. aborted) in a step that did not schedule it


_PHASE_STATE = {"prefill": SeqState.PREFILL, "decode": SeqState.DECODE, "verify": SeqState.VERIFY}


@dataclass(frozen=True)
class TimelineRow:
    seq_id: int
    request_id: str
    label: str
    arrival_step: int
    finish_step: int | None
    finish_reason: str | None


@dataclass(frozen=True)
class TimelineEvent:
    step: int
    seq_id: int
    kind: str  # "preempted" | "finished"
    detail: str  # the preemption reason or the finish reason


@dataclass(frozen=True)
class StepTokens:
    step: int
    prefill: int
    decode: int
    spec: int
    budget: int
    num_seqs: int
    max_num_seqs: int
    grammar_rows: int = 0  # structured outputs: logits rows a grammar masked, and the masks' time
    grammar_ms: float = 0.0

    @property
    def total(self) -> int:
        return self.prefill + self.decode + self.spec


@dataclass(frozen=True)
class TimelineView:
    rows: tuple[TimelineRow, ...]
    num_steps: int
    states: tuple[tuple[SeqState | None, ...], ...]  # rows x steps; None: not arrived or done
    events: tuple[TimelineEvent, ...]
    tokens: tuple[StepTokens, ...]
    cursor: int

    def state(self, seq_id: int, step: int) -> SeqState | None:
        for r, row in enumerate(self.rows):
            if row.seq_id == seq_id:
                return self.states[r][step]
        raise KeyError(f"no sequence {seq_id} in the timeline")


def timeline_view(trace: Sequence[StepTrace], cursor: int | None = None, upto: int | None = None) -> TimelineView:
    """The timeline of steps 0..upto (default: all), with a cursor on one step."""
    last = clamp_step(trace, upto)
    cur = min(clamp_step(trace, cursor), last)
    infos = seq_infos(trace, last)
    order = list(infos)  # arrival order
    row_of = {sid: r for r, sid in enumerate(order)}
    n = last + 1
    grid: list[list[SeqState | None]] = [[None] * n for _ in order]
    events: list[TimelineEvent] = []
    finish: dict[int, tuple[int, str]] = {}
    tokens = []
    live: set[int] = set()
    for i, rec in enumerate(trace[:n]):
        for a in rec.arrivals:
            live.update(a.seq_ids)
        scheduled = {s.seq_id: s for s in rec.scheduled}
        holding = {sid for sid, _ in rec.block_tables}
        preempted = {p.seq_id: p for p in rec.preemptions}
        finished = {f.seq_id: f for f in rec.finished}
        for sid in list(live) + [s for s in scheduled if s not in live]:
            if sid not in row_of:
                continue
            if sid in scheduled:
                st = _PHASE_STATE.get(scheduled[sid].phase, SeqState.PREFILL)
            elif sid in preempted:
                st = SeqState.PREEMPTED
            elif sid in finished:
                st = SeqState.FINISHED
            elif sid in holding:
                st = SeqState.STALLED
            else:
                st = SeqState.WAITING
            grid[row_of[sid]][i] = st
        for sid, p in preempted.items():
            events.append(TimelineEvent(i, sid, "preempted", p.reason))
        for sid, f in finished.items():
            events.append(TimelineEvent(i, sid, "finished", f.reason))
            finish[sid] = (i, f.reason)
            live.discard(sid)
        tokens.append(StepTokens(i, rec.num_prefill_tokens, rec.num_decode_tokens, rec.num_spec_tokens,
                                 rec.token_budget, len(rec.scheduled), rec.max_num_seqs,
                                 rec.grammar_rows, rec.grammar_s * 1e3))
    rows = tuple(
        TimelineRow(sid, infos[sid].request_id, infos[sid].label, infos[sid].arrival_step,
                    *(finish[sid] if sid in finish else (None, None)))
        for sid in order
    )
    return TimelineView(rows, n, tuple(tuple(r) for r in grid), tuple(events), tuple(tokens), cur)
