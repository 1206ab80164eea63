"""Who is who in a trace: sequence ids -> request ids and arrival steps.

The step records name sequences by id; the views label them by request. A
sequence's identity is fixed at its arrival, so one pass over the arrivals
is enough.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from minillm.engine.trace import StepTrace


@dataclass(frozen=True)
class SeqInfo:
    seq_id: int
    request_id: str
    index: int  # completion index within its request (n > 1)
    num_siblings: int
    arrival_step: int
    num_prompt_tokens: int

    @property
    def label(self) -> str:
        return self.request_id if self.num_siblings == 1 else f"{self.request_id}#{self.index}"


def seq_infos(trace: Sequence[StepTrace], upto: int | None = None) -> dict[int, SeqInfo]:
    """Every sequence that arrived in steps 0..upto (inclusive), in arrival order."""
    last = len(trace) - 1 if upto is None else upto
    out: dict[int, SeqInfo] = {}
    for rec in trace[: last + 1]:
        for a in rec.arrivals:
            for i, sid in enumerate(a.seq_ids):
                out[sid] = SeqInfo(sid, a.request_id, i, len(a.seq_ids), rec.step, a.num_prompt_tokens)
        # a trace cut from the middle of a run names sequences it never saw arrive
        for s in rec.scheduled:
            if s.seq_id not in out:
                out[s.seq_id] = SeqInfo(s.seq_id, s.request_id, 0, 1, rec.step, s.num_prompt_tokens)
    return out


def clamp_step(trace: Sequence[StepTrace], step: int | None) -> int:
    """Index of a step in the trace; None or out of range means the last one."""
    if not trace:
        raise ValueError("the trace is empty: run at least one engine step first")
    if step is None or step >= len(trace):
        return len(trace) - 1
    if step < 0:
        return max(0, len(trace) + step)
    return step
