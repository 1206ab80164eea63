"""Each engine step on the roofline: its intensity, achieved FLOP/s and bytes/s, and how close to the roof.

A step's FLOPs and bytes are counted analytically by the engine (StepTrace.flops,
.bytes_moved); its wall time is measured. The attainable performance at
intensity I = FLOPs / bytes is min(peak FLOP/s, bandwidth x I) -- the roof.
The fraction of roof says how much of what the machine could do at that
intensity the step achieved; `bound` says which roof is the lower one there
(decode at small batch: memory; long prefill chunks: compute).
Everything reads the trace only, so it works on recorded or synthetic traces.

The roofs are upper bounds (roofs.py), so `roof_fraction` > 1 means the roofs
do not fit this run (measured under load, or with another thread count):
such steps are flagged (`above_roof`) and counted, never passed off as fact.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Literal

from minillm.engine.trace import StepTrace

Bound = Literal["memory", "compute"]


@dataclass(frozen=True)
class RoofPair:
    """The two roofs a step is compared with (one dtype's matmul peak)."""

    bandwidth_bytes_per_s: float
    peak_flops_per_s: float

    def __post_init__(self) -> None:
        if not (self.bandwidth_bytes_per_s > 0 and self.peak_flops_per_s > 0):
            raise ValueError(f"roofs must be positive, got {self}")

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte where the two roofs meet: left of it a step is memory-bound."""
        return self.peak_flops_per_s / self.bandwidth_bytes_per_s

    def attainable(self, intensity: float) -> float:
        return min(self.peak_flops_per_s, self.bandwidth_bytes_per_s * intensity)

    @classmethod
    def from_roofs(cls, roofs: Any, dtype: str = "float32") -> "RoofPair":
        """From minillm.roofline.Roofs (measured) for one dtype."""
        return cls(roofs.bandwidth_bytes_per_s, roofs.flops_per_s(dtype))


@dataclass(frozen=True)
class StepRoofline:
    step: int
    phase: str  # "prefill", "decode", "mixed" (both in one step) or "idle" (nothing computed)
    num_tokens: int
    duration_s: float
    flops: float
    bytes_moved: float
    intensity: float  # FLOPs / byte
    achieved_flops_per_s: float
    achieved_bytes_per_s: float
    attainable_flops_per_s: float  # the roof at this intensity
    roof_fraction: float  # achieved / attainable
    bandwidth_fraction: float  # achieved bytes/s / the bandwidth roof
    compute_fraction: float  # achieved FLOP/s / the matmul peak
    bound: Bound

    @property
    def above_roof(self) -> bool:
        return self.roof_fraction > 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"above_roof": self.above_roof}


def step_phase(rec: StepTrace) -> str:
    prefill = rec.num_prefill_tokens > 0
    decode = rec.num_decode_tokens + rec.num_spec_tokens > 0
    return "mixed" if prefill and decode else "prefill" if prefill else "decode" if decode else "idle"


def step_roofline(rec: StepTrace, roofs: RoofPair) -> StepRoofline:
    """One step against the roofs (the trace's arithmetic_intensity and achieved FLOP/s and bytes/s)."""
    intensity = rec.arithmetic_intensity
    achieved = rec.achieved_flops_per_s
    bytes_s = rec.achieved_bytes_per_s
    attainable = roofs.attainable(intensity)
    return StepRoofline(
        step=rec.step, phase=step_phase(rec), num_tokens=rec.num_tokens, duration_s=rec.duration_s,
        flops=rec.flops, bytes_moved=rec.bytes_moved, intensity=intensity,
        achieved_flops_per_s=achieved, achieved_bytes_per_s=bytes_s, attainable_flops_per_s=attainable,
        roof_fraction=achieved / attainable if attainable > 0 else 0.0,
        bandwidth_fraction=bytes_s / roofs.bandwidth_bytes_per_s,
        compute_fraction=achieved / roofs.peak_flops_per_s,
        bound="memory" if intensity < roofs.ridge_intensity else "compute",
    )


def trace_roofline(trace: Iterable[StepTrace], roofs: RoofPair, include_idle: bool = False) -> list[StepRoofline]:
    """Every step that computed something (or every step, with include_idle)."""
    rows = [step_roofline(r, roofs) for r in trace]
    return rows if include_idle else [r for r in rows if r.phase != "idle"]


def roofline_summary(rows: list[StepRoofline]) -> dict[str, dict[str, float]]:
    """Per phase (and "all"): steps, and medians of intensity, FLOP/s, bytes/s and the fractions of the roofs.

    Time-weighted totals are given too: total FLOPs / total time over the phase's steps.
    """
    out: dict[str, dict[str, float]] = {}
    groups: dict[str, list[StepRoofline]] = {"all": rows}
    for r in rows:
        groups.setdefault(r.phase, []).append(r)
    for phase, rs in groups.items():
        if not rs:
            continue
        t = sum(r.duration_s for r in rs)
        out[phase] = {
            "num_steps": len(rs),
            "median_intensity": statistics.median(r.intensity for r in rs),
            "median_achieved_flops_per_s": statistics.median(r.achieved_flops_per_s for r in rs),
            "median_achieved_bytes_per_s": statistics.median(r.achieved_bytes_per_s for r in rs),
            "median_roof_fraction": statistics.median(r.roof_fraction for r in rs),
            "median_bandwidth_fraction": statistics.median(r.bandwidth_fraction for r in rs),
            "median_compute_fraction": statistics.median(r.compute_fraction for r in rs),
            "memory_bound_steps": sum(r.bound == "memory" for r in rs),
            "above_roof_steps": sum(r.above_roof for r in rs),
            "max_roof_fraction": max(r.roof_fraction for r in rs),
            "total_flops_per_s": sum(r.flops for r in rs) / t if t > 0 else 0.0,
            "total_bytes_per_s": sum(r.bytes_moved for r in rs) / t if t > 0 else 0.0,
        }
    return out
