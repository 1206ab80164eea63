"""Headless timing for the course notebooks: pinned threads, a busy-machine warning, repeats with spread.

Why it exists: a notebook that times the engine while a widget animates, with an
unpinned thread count, on a machine another tenant is loading, measures the noise
(issue 16: a 2-thread decode step took 737 ms under load vs 59-80 ms on one thread).
The notebooks therefore pin torch's threads, say when the machine is busy, repeat
each measurement and show the median with its range.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one quantity: the median we quote and the range around it."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    def fmt(self, spec: str = ".2f", scale: float = 1.0, unit: str = "") -> str:
        """'median<unit> (range min-max, n runs)'."""
        return (f"{self.median * scale:{spec}}{unit} (range {self.lo * scale:{spec}}-{self.hi * scale:{spec}}, "
                f"{len(self.values)} runs)")


def pin_threads(n: int = 1) -> int:
    """Fix torch's intra-op threads (1 by default: on a shared 2-core VM a busy core stalls every
    2-thread op); returns the previous count."""
    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    return prev


def machine_busy(threshold: float = 0.75) -> str | None:
    """A warning when the 1-minute load average exceeds `threshold` x the CPUs, else None."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return None
    cpus = os.cpu_count() or 1
    if load > threshold * cpus:
        return (f"WARNING: the machine is busy (load {load:.1f} on {cpus} CPUs): other work shares the cores, "
                f"so these timings are noisier and slower than on a quiet machine")
    return None


def warn_if_busy() -> None:
    msg = machine_busy()
    if msg:
        print(msg)
