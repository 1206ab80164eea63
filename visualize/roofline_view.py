"""View model of the roofline: each step as a point under the machine's two roofs.

A step does `flops` of work and moves `bytes_moved` bytes (both counted from
the model config and the batch, see minillm/engine/cost.py). Its arithmetic
intensity I = flops / bytes places it on the x axis. The machine can at best
reach min(peak FLOP/s, bandwidth * I): the roof. Two points per step:

- measured: flops / the step's wall time -- what the engine achieved;
- analytic: the same counted FLOPs at the roof -- what a perfect engine would
  achieve on this machine; the gap between them is the engine's overhead.

Decode at batch 1 reads every weight for one token per sequence, so I is about
(2 FLOPs per weight) / (bytes per weight): far left, under the bandwidth roof.
Batching B decodes multiplies FLOPs by B for nearly the same bytes: the point
moves right until it meets the ridge.

A roof is an upper bound (minillm/roofline/roofs.py measures the best the
machine does), so a measured point above it means the roof is wrong for this
run -- measured under load, with other threads, or the step's bytes or FLOPs
are miscounted. Such a point is kept, flagged (`above_roof`) and explained in
the caption, never silently drawn above the roof.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from minillm.engine.trace import StepTrace
from minillm.visualize.trace_index import clamp_step


@dataclass(frozen=True)
class Roofs:
    """The two roofs: memory bandwidth (bytes/s) and peak compute (FLOP/s)."""

    bandwidth: float
    peak_flops: float
    label: str = ""

    @property
    def ridge(self) -> float:
        """The intensity (FLOP/byte) where the two roofs meet."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        return min(self.peak_flops, self.bandwidth * intensity)

    def time_at_roof(self, flops: float, bytes_moved: float) -> float:
        """The shortest time the machine can do this work in."""
        return max(flops / self.peak_flops, bytes_moved / self.bandwidth)


@dataclass(frozen=True)
class RooflinePoint:
    step: int
    kind: str  # "prefill" | "decode" | "mixed" | "verify"
    num_seqs: int
    num_tokens: int
    flops: float
    bytes_moved: float
    duration_s: float
    intensity: float  # FLOP / byte
    measured: float  # FLOP / s achieved
    analytic: float  # FLOP / s at the roof for this intensity
    bound: str  # "memory" | "compute": which roof is lower here

    @property
    def efficiency(self) -> float:
        return self.measured / self.analytic if self.analytic else 0.0

    @property
    def above_roof(self) -> bool:
        return self.efficiency > 1.0

    @property
    def achieved_bandwidth(self) -> float:
        return self.bytes_moved / self.duration_s if self.duration_s > 0 else 0.0


@dataclass(frozen=True)
class RooflineView:
    roofs: Roofs
    points: tuple[RooflinePoint, ...]  # every step that did work, in step order
    cursor: int | None  # index into points of the cursor step (None: that step did no work)

    @property
    def current(self) -> RooflinePoint | None:
        return None if self.cursor is None else self.points[self.cursor]

    def by_kind(self, kind: str) -> tuple[RooflinePoint, ...]:
        return tuple(p for p in self.points if p.kind == kind)

    @property
    def above_roof(self) -> tuple[RooflinePoint, ...]:
        """Points measured faster than the roof allows (see the module docstring)."""
        return tuple(p for p in self.points if p.above_roof)


def step_kind(rec: StepTrace) -> str:
    if rec.num_spec_tokens:
        return "verify"
    if rec.num_prefill_tokens and rec.num_decode_tokens:
        return "mixed"
    return "prefill" if rec.num_prefill_tokens else "decode"


def roofline_point(rec: StepTrace, roofs: Roofs, index: int) -> RooflinePoint:
    intensity = rec.flops / rec.bytes_moved
    measured = rec.flops / rec.duration_s if rec.duration_s > 0 else 0.0
    return RooflinePoint(
        step=index, kind=step_kind(rec), num_seqs=len(rec.scheduled), num_tokens=rec.num_tokens,
        flops=rec.flops, bytes_moved=rec.bytes_moved, duration_s=rec.duration_s,
        intensity=intensity, measured=measured, analytic=roofs.attainable(intensity),
        bound="memory" if intensity < roofs.ridge else "compute",
    )


def roofline_view(trace: Sequence[StepTrace], roofs: Roofs, cursor: int | None = None,
                  upto: int | None = None) -> RooflineView:
    """Points for steps 0..upto (default: all) that did work; the cursor marks one step."""
    if not trace:
        return RooflineView(roofs, (), None)
    last = clamp_step(trace, upto)
    cur = min(clamp_step(trace, cursor), last)
    points, at = [], None
    for i, rec in enumerate(trace[: last + 1]):
        if rec.flops <= 0 or rec.bytes_moved <= 0:
            continue  # an empty step (nothing scheduled) has no place on the plot
        if i == cur:
            at = len(points)
        points.append(roofline_point(rec, roofs, i))
    return RooflineView(roofs, tuple(points), at)
