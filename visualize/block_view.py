"""View model of the paged KV pool at one step: a pure function of the trace.

What a reader should see: which physical block belongs to which sequence,
which blocks are shared (ref count > 1, a cached prefix or n > 1 siblings),
which free blocks still hold cached content and in which order the free queue
will hand them out (and so evict them), what the step allocated, freed,
evicted and shared, and why any sequence was preempted.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Sequence

from minillm.engine.trace import StepTrace
from minillm.visualize.trace_index import clamp_step, seq_infos


class BlockState(IntEnum):
    FREE = 0  # ref count 0, nothing reusable inside
    CACHED_FREE = 1  # ref count 0 but holds a prefix hash: a future hit revives it
    USED = 2  # held by one sequence
    SHARED = 3  # held by several sequences (ref count > 1)


@dataclass(frozen=True)
class BlockCell:
    block_id: int
    state: BlockState
    ref_count: int
    cached: bool
    owners: tuple[tuple[int, int], ...]  # (seq_id, logical block index) of every table naming it
    free_position: int | None  # place in the free queue: 0 is handed out (and evicted) next
    allocated: bool  # events of this step
    freed: bool
    evicted: bool
    shared: bool


@dataclass(frozen=True)
class SeqBlockTable:
    """One sequence's logical -> physical map: logical block i is physical[i]."""

    seq_id: int
    request_id: str
    label: str
    physical: tuple[int, ...]
    shared: tuple[bool, ...]  # per logical block: is the physical block shared (ref > 1)
    num_cached_tokens: int  # tokens whose K/V are in the cache after the step

    @property
    def num_blocks(self) -> int:
        return len(self.physical)


@dataclass(frozen=True)
class PreemptionNote:
    seq_id: int
    request_id: str
    reason: str
    num_blocks_freed: int
    num_tokens_lost: int


@dataclass(frozen=True)
class BlockTableView:
    step: int
    num_blocks: int
    block_size: int
    cells: tuple[BlockCell, ...]
    tables: tuple[SeqBlockTable, ...]
    free_queue: tuple[int, ...]
    allocated: tuple[int, ...]
    freed: tuple[int, ...]
    evicted: tuple[int, ...]
    shared_events: tuple[int, ...]
    preemptions: tuple[PreemptionNote, ...]
    prefix_hit_tokens: int
    prefix_queried_tokens: int

    @property
    def shared_blocks(self) -> tuple[BlockCell, ...]:
        return tuple(c for c in self.cells if c.ref_count > 1)

    @property
    def num_used(self) -> int:
        return sum(1 for c in self.cells if c.ref_count > 0)

    @property
    def num_cached_free(self) -> int:
        return sum(1 for c in self.cells if c.state == BlockState.CACHED_FREE)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks if self.num_blocks else 0.0

    @property
    def utilization(self) -> float:
        """Cached tokens / slots in the blocks the tables hold (1 - internal fragmentation)."""
        slots = sum(t.num_blocks for t in self.tables) * self.block_size
        return sum(t.num_cached_tokens for t in self.tables) / slots if slots else 0.0

    def table(self, seq_id: int) -> SeqBlockTable:
        for t in self.tables:
            if t.seq_id == seq_id:
                return t
        raise KeyError(f"sequence {seq_id} holds no blocks at step {self.step}")


def cached_tokens_per_seq(trace: Sequence[StepTrace], upto: int) -> dict[int, int]:
    """Tokens in the KV cache per sequence after step `upto` (context of its last chunk)."""
    tokens: dict[int, int] = {}
    for rec in trace[: upto + 1]:
        for p in rec.preemptions:  # recompute: its cache is gone
            tokens.pop(p.seq_id, None)
        for s in rec.scheduled:
            tokens[s.seq_id] = s.context_len
        for f in rec.finished:
            tokens.pop(f.seq_id, None)
    return tokens


def block_table_view(trace: Sequence[StepTrace], step: int | None = None) -> BlockTableView:
    i = clamp_step(trace, step)
    rec = trace[i]
    infos = seq_infos(trace, i)
    owners: dict[int, list[tuple[int, int]]] = {}
    for sid, blocks in rec.block_tables:
        for logical, bid in enumerate(blocks):
            owners.setdefault(bid, []).append((sid, logical))
    queue_pos = {bid: k for k, bid in enumerate(rec.free_queue)}
    alloc, freed, evicted, shared = (set(rec.blocks_allocated), set(rec.blocks_freed),
                                     set(rec.blocks_evicted), set(rec.blocks_shared))
    cells = []
    for bid in range(rec.num_blocks):
        ref, cached = rec.block_ref_counts[bid], rec.block_cached[bid]
        if ref > 1:
            state = BlockState.SHARED
        elif ref == 1:
            state = BlockState.USED
        else:
            state = BlockState.CACHED_FREE if cached else BlockState.FREE
        cells.append(BlockCell(bid, state, ref, cached, tuple(owners.get(bid, ())), queue_pos.get(bid),
                               bid in alloc, bid in freed, bid in evicted, bid in shared))
    tokens = cached_tokens_per_seq(trace, i)
    tables = []
    for sid, blocks in rec.block_tables:
        info = infos.get(sid)
        rid = info.request_id if info else f"seq{sid}"
        tables.append(SeqBlockTable(
            sid, rid, info.label if info else rid, tuple(blocks),
            tuple(rec.block_ref_counts[b] > 1 for b in blocks), tokens.get(sid, 0),
        ))
    notes = tuple(PreemptionNote(p.seq_id, p.request_id, p.reason, p.num_blocks_freed, p.num_tokens_lost)
                  for p in rec.preemptions)
    return BlockTableView(
        step=i, num_blocks=rec.num_blocks, block_size=rec.block_size, cells=tuple(cells), tables=tuple(tables),
        free_queue=tuple(rec.free_queue), allocated=tuple(rec.blocks_allocated), freed=tuple(rec.blocks_freed),
        evicted=tuple(rec.blocks_evicted), shared_events=tuple(rec.blocks_shared), preemptions=notes,
        prefix_hit_tokens=rec.prefix_hit_tokens, prefix_queried_tokens=rec.prefix_queried_tokens,
    )


def draft_block_table_view(trace: Sequence[StepTrace], step: int | None = None) -> BlockTableView:
    """A separate draft model's own KV pool at one step (StepTrace.draft), in the same view model.

    The draft pool shares nothing and caches no prefix: a block is used (one owner) or free; its
    events are the step's allocations and frees (rolled-back guesses, finished or evicted sequences).
    """
    i = clamp_step(trace, step)
    rec = trace[i]
    d = rec.draft
    if d is None:
        raise ValueError(f"step {i} records no draft pool: only a separate draft model "
                         f"(speculative method 'draft' with a model of its own) has one")
    infos = seq_infos(trace, i)
    owners = {bid: ((sid, logical),) for sid, blocks in d.block_tables for logical, bid in enumerate(blocks)}
    alloc, freed = set(d.blocks_allocated), set(d.blocks_freed)
    cells = tuple(BlockCell(bid, BlockState.USED if bid in owners else BlockState.FREE, int(bid in owners), False,
                            owners.get(bid, ()), None, bid in alloc, bid in freed, False, False)
                  for bid in range(d.num_blocks))
    cached = dict(d.cached_tokens)
    tables = []
    for sid, blocks in d.block_tables:
        info = infos.get(sid)
        rid = info.request_id if info else f"seq{sid}"
        tables.append(SeqBlockTable(sid, rid, info.label if info else rid, tuple(blocks), (False,) * len(blocks),
                                    cached.get(sid, 0)))
    return BlockTableView(step=i, num_blocks=d.num_blocks, block_size=rec.block_size, cells=cells,
                          tables=tuple(tables), free_queue=(), allocated=tuple(d.blocks_allocated),
                          freed=tuple(d.blocks_freed), evicted=(), shared_events=(), preemptions=(),
                          prefix_hit_tokens=0, prefix_queried_tokens=0)
