"""A contiguous KV allocator: the pre-paging baseline that paged attention replaced.

Why it exists: to measure what paging buys, the course needs the system it
replaced, not a formula. Before vLLM, servers (FasterTransformer, Orca) kept
each request's K/V in one contiguous region, reserved when the request was
admitted and sized for the longest it could become, because its final length
is unknown until it stops. That costs memory two ways (Kwon et al., SOSP 2023,
section 3):

- internal fragmentation: slots reserved for tokens not (or never) written;
- external fragmentation: free slots split into gaps, each too small for the
  next reservation, although together they would hold it.

This module is the address space only: first-fit reservation of `size` slots in
`[0, capacity)`, a free list of gaps kept sorted and coalesced on free, and an
exact account of both kinds of waste. `ContiguousBlockManager`
(contiguous_block_manager.py) drives the real engine with it.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Hashable, Mapping


@dataclass(frozen=True)
class Extent:
    """Slots [start, start + size)."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass(frozen=True)
class FragmentationReport:
    """Where every slot of the region is, at one moment (all counts in slots)."""

    capacity: int
    reserved: int  # held by reservations
    used: int  # holding a token (<= reserved)
    free: int  # capacity - reserved
    largest_gap: int
    next_size: int  # the reservation the report judges the gaps against (0: none pending)
    external: int  # free slots in gaps smaller than next_size: free, yet useless to it

    @property
    def internal(self) -> int:
        """Reserved but holding no token."""
        return self.reserved - self.used

    @property
    def utilization(self) -> float:
        """Tokens over reserved slots (1.0 when nothing is reserved)."""
        return self.used / self.reserved if self.reserved else 1.0


class ContiguousAllocator:
    """First-fit reservations in one contiguous region of `capacity` slots."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.gaps: list[Extent] = [Extent(0, capacity)]  # free extents, sorted by start, never adjacent
        self.reservations: dict[Hashable, Extent] = {}

    @property
    def free_slots(self) -> int:
        return sum(g.size for g in self.gaps)

    @property
    def largest_gap(self) -> int:
        return max((g.size for g in self.gaps), default=0)

    def can_reserve(self, size: int) -> bool:
        return self.largest_gap >= size

    def reserve(self, owner: Hashable, size: int) -> Extent | None:
        """The first gap that holds `size` slots gives its front; None when no gap does."""
        if size < 1:
            raise ValueError(f"a reservation needs >= 1 slot, got {size}")
        if owner in self.reservations:
            raise ValueError(f"{owner!r} already holds {self.reservations[owner]}")
        for i, gap in enumerate(self.gaps):
            if gap.size >= size:
                ext = Extent(gap.start, size)
                if gap.size == size:
                    del self.gaps[i]
                else:
                    self.gaps[i] = Extent(gap.start + size, gap.size - size)
                self.reservations[owner] = ext
                return ext
        return None

    def free(self, owner: Hashable) -> Extent:
        """Return the owner's extent to the free list, merged with the gaps on either side."""
        ext = self.reservations.pop(owner)
        i = bisect.bisect_left([g.start for g in self.gaps], ext.start)
        start, end = ext.start, ext.end
        if i < len(self.gaps) and self.gaps[i].start == end:  # the gap right after
            end = self.gaps.pop(i).end
        if i > 0 and self.gaps[i - 1].end == start:  # the gap right before
            start = self.gaps.pop(i - 1).start
            i -= 1
        self.gaps.insert(i, Extent(start, end - start))
        return ext

    def report(self, used: Mapping[Hashable, int], next_size: int = 0) -> FragmentationReport:
        """Account for every slot; `used[owner]` is how many of its reserved slots hold a token."""
        for owner, n in used.items():
            if not 0 <= n <= self.reservations[owner].size:
                raise ValueError(f"{owner!r} uses {n} of {self.reservations[owner].size} slots")
        reserved = sum(e.size for e in self.reservations.values())
        return FragmentationReport(
            capacity=self.capacity, reserved=reserved, used=sum(used.values()), free=self.capacity - reserved,
            largest_gap=self.largest_gap, next_size=next_size,
            external=sum(g.size for g in self.gaps if g.size < next_size),
        )
