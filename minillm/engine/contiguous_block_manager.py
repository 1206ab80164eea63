"""The real engine on contiguous KV reservations (EngineConfig(kv_allocator="contiguous"...)).

Why it exists: it is the pre-paging baseline run for real, so notebook 03 measures
paging against it (tokens from the real model, concurrency and throughput from the
trace) instead of computing the baseline by formula.

A sequence is admitted only if one contiguous run of free slots holds its whole
reservation, taken at once from a ContiguousAllocator over the pool's slots:

- kv_allocator="contiguous": `max_model_len` slots, as a server that cannot know the
  final length must reserve (FasterTransformer, Orca "Max" in the vLLM paper);
- kv_allocator="contiguous-request": prompt + max_tokens (capped at max_model_len),
  the request's own worst case, which it reaches when it runs to max_tokens.

Both round up to whole blocks, so a reservation is a run of consecutive physical
blocks: the block table is [s, s+1, ..., s+n-1], contiguous in the KV tensors, and
the same attention kernels read it. The whole run is the sequence's table from
admission on and is held until it finishes: no growth, so never a preemption, and
nothing shared (no prefix cache; n > 1 siblings recompute their prompt).
"""
from __future__ import annotations

from dataclasses import dataclass

from minillm.engine.block_manager import BlockManager
from minillm.engine.contiguous_allocator import ContiguousAllocator, FragmentationReport
from minillm.engine.sequence import Sequence

from minillm.engine.config import KV_ALLOCATORS  # noqa: F401  (the values of EngineConfig.kv_allocator)


@dataclass
class AdmissionRefusals:
    """Why admissions were refused (counted each time the scheduler asked for a new reservation)."""

    capacity: int = 0  # fewer free slots in total than the reservation
    fragmentation: int = 0  # enough free slots in total, but no single gap holds it


class ContiguousBlockManager(BlockManager):
    memoize_snapshot = False  # its own state changes without BlockManager.version (see block_snapshot)

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, reserve: str = "max_model_len") -> None:
        if reserve not in ("max_model_len", "request"):
            raise ValueError(f"reserve must be 'max_model_len' or 'request', got {reserve!r}")
        super().__init__(num_blocks, block_size, enable_prefix_caching=False)
        self.max_model_len = max_model_len
        self.reserve = reserve
        self.allocator = ContiguousAllocator(num_blocks * block_size)  # slots = tokens
        self.holders: dict[int, Sequence] = {}  # seq_id -> the sequence holding a reservation
        self.refusals = AdmissionRefusals()
        self.last_refused_size = 0

    def reservation_slots(self, seq: Sequence) -> int:
        """Slots reserved at admission, rounded up to whole blocks."""
        want = self.max_model_len
        if self.reserve == "request":
            want = min(want, seq.num_prompt_tokens + seq.max_tokens)
        return self.blocks_needed(want) * self.block_size

    # ----- what the scheduler asks -------------------------------------------------------------
    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached: list[int] = ()) -> bool:
        if seq.block_table:  # inside its reservation: fits or never will
            return self.blocks_needed(seq.num_computed_tokens + num_new_tokens) <= len(seq.block_table)
        size = self.reservation_slots(seq)
        if size > self.allocator.capacity:
            raise ValueError(f"seq {seq.seq_id} needs a {size}-slot reservation; the pool has "
                             f"{self.allocator.capacity} slots")
        if self.allocator.can_reserve(size):
            return True
        self.last_refused_size = size
        if self.allocator.free_slots >= size:
            self.refusals.fragmentation += 1
        else:
            self.refusals.capacity += 1
        return False

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        if not seq.block_table:
            ext = self.allocator.reserve(seq.seq_id, self.reservation_slots(seq))
            if ext is None:
                raise RuntimeError(f"no contiguous run of {self.reservation_slots(seq)} slots for seq {seq.seq_id}")
            first = ext.start // self.block_size
            for bid in range(first, first + ext.size // self.block_size):
                del self.free_queue[bid]  # the whole run is this sequence's from now on
                self.blocks[bid].ref_count = 1
                self.events.allocated.append(bid)
                seq.block_table.append(bid)
            self.holders[seq.seq_id] = seq
        if self.blocks_needed(seq.num_computed_tokens + num_new_tokens) > len(seq.block_table):
            raise RuntimeError(f"seq {seq.seq_id} outgrew its {len(seq.block_table)}-block reservation")

    def free(self, seq: Sequence) -> None:
        if self.holders.pop(seq.seq_id, None) is not None:
            self.allocator.free(seq.seq_id)
        super().free(seq)

    def trim(self, seq: Sequence) -> None:
        pass  # draft slots sit inside the reservation, which is held until the end

    def share_prefix(self, child: Sequence, parent: Sequence, num_blocks: int) -> None:
        super().share_prefix(child, parent, 0)  # a reservation is private: the child recomputes its prompt

    # ----- what it costs ------------------------------------------------------------------------
    def fragmentation(self, next_size: int | None = None) -> FragmentationReport:
        """Every slot now: tokens held, reserved but empty (internal), free in gaps too small for
        `next_size` (external; default: the last reservation refused, 0 if none)."""
        used = {sid: min(s.num_computed_tokens, self.allocator.reservations[sid].size)
                for sid, s in self.holders.items()}
        return self.allocator.report(used, self.last_refused_size if next_size is None else next_size)
