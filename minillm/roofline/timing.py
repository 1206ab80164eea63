"""Time a callable on CPU (perf_counter) or GPU (CUDA events), median of repeats.

On a GPU the host returns before the kernels finish, so wall-clock time around
a launch measures nothing; CUDA events recorded on the stream do.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def time_once(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of fn takes on device."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_repeats(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return [time_once(fn, device) for _ in range(repeats)]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
