"""The collectives tensor parallelism needs (and pipeline parallelism's send / recv), with byte counters.

Bytes counted are the payload of each call on this rank: the tensor summed by an
all-reduce, the full tensor assembled by an all-gather. (A ring all-reduce puts
2 (N-1)/N times the payload on each rank's link; analytic.py applies that.)
Every rank issues the same collectives, so rank 0's counts are everyone's. Point-to-point
bytes (pipeline stages) are only the ones rank 0 sends and receives.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class CommStats:
    allreduce_bytes: int = 0
    allreduce_calls: int = 0
    allgather_bytes: int = 0
    allgather_calls: int = 0
    p2p_bytes: int = 0
    time_s: float = 0.0  # wall time inside collectives (CPU/gloo: synchronous, so this is real)

    def take(self) -> "CommStats":
        """Return the counts so far and start again from zero (one step's worth)."""
        out = CommStats(self.allreduce_bytes, self.allreduce_calls, self.allgather_bytes, self.allgather_calls,
                        self.p2p_bytes, self.time_s)
        self.__init__()
        return out


STATS = CommStats()  # this process's counter: one TP engine per process


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum x over all ranks, in place."""
    t0 = time.perf_counter()
    dist.all_reduce(x)
    STATS.time_s += time.perf_counter() - t0
    STATS.allreduce_bytes += x.numel() * x.element_size()
    STATS.allreduce_calls += 1
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's x along the last dimension (same shape on every rank)."""
    t0 = time.perf_counter()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    out = torch.cat(parts, dim=-1)
    STATS.time_s += time.perf_counter() - t0
    STATS.allgather_bytes += out.numel() * out.element_size()
    STATS.allgather_calls += 1
    return out


def send(x: torch.Tensor, dst: int) -> None:
    """Blocking send to rank dst (the next pipeline stage, or the logits back to rank 0)."""
    t0 = time.perf_counter()
    dist.send(x.contiguous(), dst)
    STATS.time_s += time.perf_counter() - t0
    STATS.p2p_bytes += x.numel() * x.element_size()


def recv(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, src: int) -> torch.Tensor:
    """Blocking receive of a tensor whose shape both sides know from the step's batch."""
    t0 = time.perf_counter()
    x = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(x, src)
    STATS.time_s += time.perf_counter() - t0
    STATS.p2p_bytes += x.numel() * x.element_size()
    return x
