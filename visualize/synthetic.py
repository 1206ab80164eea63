"""Hand-made StepTrace records: test the views (and explain them) without running a model.

    make_step(0, num_blocks=8, block_tables={0: (0, 1)}, ...)

Only the fields a view reads need to be given; the pool's ref counts and
free queue are derived from the block tables unless passed explicitly.
"""
from __future__ import annotations

from typing import Iterable

from minillm.engine.trace import Arrival, Finished, Preemption, ScheduledSeq, SpecRecord, StepTrace


def sched(seq_id: int, phase: str, num_new: int, before: int, prompt: int, request_id: str | None = None,
          hit: int = 0) -> ScheduledSeq:
    """One sequence's chunk of a step."""
    return ScheduledSeq(seq_id, request_id or f"r{seq_id}", phase, num_new, before, before + num_new, hit, prompt,
                        before + num_new >= prompt)


def make_step(
    step: int,
    *,
    num_blocks: int = 8,
    block_size: int = 4,
    block_tables: dict[int, tuple[int, ...]] | None = None,
    cached: Iterable[int] = (),
    free_queue: tuple[int, ...] | None = None,
    scheduled: tuple[ScheduledSeq, ...] = (),
    arrivals: tuple[Arrival, ...] = (),
    finished: tuple[Finished, ...] = (),
    preemptions: tuple[Preemption, ...] = (),
    allocated: tuple[int, ...] = (),
    freed: tuple[int, ...] = (),
    evicted: tuple[int, ...] = (),
    shared: tuple[int, ...] = (),
    spec: tuple[SpecRecord, ...] = (),
    token_budget: int = 32,
    max_num_seqs: int = 8,
    num_waiting: int = 0,
    start_time: float | None = None,
    duration_s: float = 0.01,
    flops: float = 0.0,
    bytes_moved: float = 0.0,
    prefix_queried_tokens: int = 0,
    prefix_hit_tokens: int = 0,
) -> StepTrace:
    tables = block_tables or {}
    refs = [0] * num_blocks
    for blocks in tables.values():
        for b in blocks:
            refs[b] += 1
    cached_set = set(cached)
    if free_queue is None:
        # uncached free blocks are handed out first, then cached ones (as the block manager does)
        free = [b for b in range(num_blocks) if refs[b] == 0]
        free_queue = tuple([b for b in free if b not in cached_set] + [b for b in free if b in cached_set])
    pre = sum(s.num_new_tokens for s in scheduled if s.phase == "prefill")
    dec = sum(s.num_new_tokens for s in scheduled if s.phase == "decode")
    spec_tokens = sum(s.num_new_tokens for s in scheduled if s.phase == "verify")
    return StepTrace(
        step=step, start_time=float(step) * 0.1 if start_time is None else start_time, duration_s=duration_s,
        scheduled=tuple(scheduled), num_prefill_tokens=pre, num_decode_tokens=dec, num_spec_tokens=spec_tokens,
        token_budget=token_budget, max_num_seqs=max_num_seqs, num_waiting=num_waiting, num_running=len(tables),
        arrivals=tuple(arrivals), new_tokens=(), finished=tuple(finished), preemptions=tuple(preemptions),
        num_blocks=num_blocks, block_size=block_size, blocks_allocated=tuple(allocated), blocks_freed=tuple(freed),
        blocks_evicted=tuple(evicted), blocks_shared=tuple(shared),
        block_tables=tuple((sid, tuple(b)) for sid, b in tables.items()),
        block_ref_counts=tuple(refs), block_cached=tuple(b in cached_set for b in range(num_blocks)),
        free_queue=tuple(free_queue), prefix_queried_tokens=prefix_queried_tokens,
        prefix_hit_tokens=prefix_hit_tokens, spec=tuple(spec), flops=flops, bytes_moved=bytes_moved,
        weight_bytes=bytes_moved, kv_read_bytes=0.0, kv_write_bytes=0.0,
    )
