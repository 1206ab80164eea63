"""A step's cost as a fixed part plus a part per token it computes, fitted to measured steps.

    t(step) = fixed + per_prompt_token * prompt tokens + per_decode_row * decode rows

Why: the batching claims (notebooks 03 and 05) change how many steps a workload takes and how
many rows each step carries. The fixed part (reading the weights, launching the step) is paid
per step; the rest grows with the rows. Fitted on one run's steps, the model predicts another
run's time from its schedule alone, so a claim can be checked against a prediction the other
run did not take part in. On a CPU whose decode is bound by arithmetic (AVX2 fp32) the per-row
part is large and fewer, fuller steps gain less than the step count suggests; on one bound by
reading the weights the fixed part dominates and the gain approaches the ratio of steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from minillm.engine.trace import StepTrace


def _schedule(trace: Sequence[StepTrace]) -> list[tuple[int, int]]:
    return [(s.num_prefill_tokens, s.num_decode_tokens) for s in trace]


def fastest_steps(traces: Sequence[Sequence[StepTrace]]) -> list[float]:
    """Each step's shortest duration over repeats of one deterministic schedule (greedy, same
    engine settings): a busy neighbour or a one-off warm-up slows single steps, never speeds them
    up, so the minimum per step is the least noisy estimate of what the step costs."""
    first = _schedule(traces[0])
    for t in traces[1:]:
        if _schedule(t) != first:
            raise ValueError("the repeats ran different schedules; fastest_steps needs the same steps in each")
    return [min(t[i].duration_s for t in traces) for i in range(len(first))]


@dataclass(frozen=True)
class FastestTime:
    """A run's seconds summed over its fastest steps (fastest_steps over all repeats), and the same
    sum with each repeat left out in turn. The leave-one-out sums say how much the estimate rests on
    any single repeat: when each step had a quiet moment in two or more repeats they agree closely;
    when one repeat alone was quiet, leaving it out moves the sum."""

    total_s: float
    leave_one_out_s: tuple[float, ...]

    @classmethod
    def of(cls, traces: Sequence[Sequence[StepTrace]]) -> "FastestTime":
        if len(traces) < 3:
            raise ValueError("repeat the run at least 3 times: leaving one out must still leave a minimum over 2")
        others = [[t for j, t in enumerate(traces) if j != i] for i in range(len(traces))]
        return cls(sum(fastest_steps(traces)), tuple(sum(fastest_steps(o)) for o in others))


@dataclass(frozen=True)
class Speedup:
    """One run's time over another's (FastestTime each): the ratio, its leave-one-out ratios (repeat i
    left out of both), and their range, the ratio's sensitivity to any one repeat."""

    value: float
    leave_one_out: tuple[float, ...]

    @classmethod
    def of(cls, baseline: FastestTime, faster: FastestTime) -> "Speedup":
        if len(baseline.leave_one_out_s) != len(faster.leave_one_out_s):
            raise ValueError("both runs need the same repeats")
        return cls(baseline.total_s / faster.total_s,
                   tuple(b / f for b, f in zip(baseline.leave_one_out_s, faster.leave_one_out_s)))

    @property
    def sensitivity(self) -> float:
        return max(self.leave_one_out) - min(self.leave_one_out)

    def fmt(self) -> str:
        return f"x{self.value:.2f} (x{min(self.leave_one_out):.2f}-{max(self.leave_one_out):.2f} leaving one repeat out)"


@dataclass(frozen=True)
class StepCost:
    fixed_s: float
    per_prompt_token_s: float
    per_decode_row_s: float

    @classmethod
    def fit(cls, trace: Sequence[StepTrace], durations: Sequence[float] | None = None) -> "StepCost":
        """Least squares over the steps; `durations` replaces the trace's own (e.g. fastest_steps)."""
        sched = np.array(_schedule(trace), dtype=np.float64)
        y = np.array([s.duration_s for s in trace] if durations is None else durations, dtype=np.float64)
        if len(y) != len(sched):
            raise ValueError(f"{len(y)} durations for {len(sched)} steps")
        if len({tuple(r) for r in sched}) < 3:
            raise ValueError("the steps need at least three different shapes to fit three coefficients")
        x = np.column_stack([np.ones(len(sched)), sched])
        (fixed, per_prompt, per_row), *_ = np.linalg.lstsq(x, y, rcond=None)
        return cls(float(fixed), float(per_prompt), float(per_row))

    def step_s(self, prompt_tokens: int, decode_rows: int) -> float:
        return self.fixed_s + self.per_prompt_token_s * prompt_tokens + self.per_decode_row_s * decode_rows

    def predict(self, trace: Sequence[StepTrace]) -> float:
        """Seconds the model predicts for a run with this trace's schedule."""
        return sum(self.step_s(p, d) for p, d in _schedule(trace))
