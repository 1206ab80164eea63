"""Is the machine quiet enough to trust a timing? Record the evidence with every report.

On a shared 2-core machine another tenant's work is invisible to /proc/stat,
but it shows up as stalls of multi-threaded ops: a parallel region waits at its
barrier for a thread whose core is busy elsewhere. We time a small parallel op
with all threads and with one; a large gap means noisy figures.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch


_PROBE_NUMEL = 1 << 18  # above ATen's parallel grain size, small enough to be ~10 us serial


def _op_us(threads: int, calls: int) -> float:
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.empty(_PROBE_NUMEL)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            x.fill_(1.0)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6
    finally:
        torch.set_num_threads(prev)


@dataclass(frozen=True)
class MachineState:
    load_average: list[float] | None
    threads: int  # the probe's threads: one per CPU
    parallel_op_us: float  # median time of the probe op with all threads
    serial_op_us: float  # the same op on one thread

    @property
    def stall_ratio(self) -> float:
        """> ~2 means parallel regions are stalling: another tenant holds a core."""
        return self.parallel_op_us / self.serial_op_us if self.serial_op_us else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "stall_ratio": self.stall_ratio}


def load_average() -> list[float] | None:
    """1/5/15-minute load of the whole VM (other tenants' work shows here, not in top)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def probe_machine_state(calls: int = 50) -> MachineState:
    """Probe with one thread per CPU whatever torch is set to: a busy core shows even in 1-thread runs."""
    threads = os.cpu_count() or 1
    return MachineState(load_average(), threads, _op_us(threads, calls), _op_us(1, calls))


QUIET_STALL_RATIO = 3.0


def settle(wait_s: float = 0.0, max_stall: float = QUIET_STALL_RATIO, calls: int = 10) -> MachineState:
    """Probe the machine; with wait_s > 0, first wait (up to wait_s) until parallel ops stop stalling.

    Called before each repeat so a repeat starts in a quiet window when one comes,
    and the probe is stored with the repeat either way.
    """
    deadline = time.perf_counter() + wait_s
    state = probe_machine_state(calls)
    while state.stall_ratio > max_stall and time.perf_counter() < deadline:
        time.sleep(1.0)
        state = probe_machine_state(calls)
    return state
