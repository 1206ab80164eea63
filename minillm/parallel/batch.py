"""One step's batch as rank 0 broadcasts it, and the forward every rank runs on it.

The scheduler's chunks hold Sequence objects (rank 0's state); the workers need
only plain lists: the token ids and positions to compute, each sequence's query
and context length, its block table, and which rows to score.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.attention.metadata import AttentionMetadata
from minillm.engine.scheduler import ScheduledChunk


@dataclass
class StepBatch:
    token_ids: list[int]
    positions: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    sample_rows: list[int]  # packed rows whose logits are wanted (chunks that catch their sequence up)

    @classmethod
    def from_chunks(cls, chunks: list[ScheduledChunk]) -> "StepBatch":
        b = cls([], [], [], [], [], [])
        for c in chunks:
            start, end = c.num_computed_before, c.num_computed_before + c.num_new_tokens
            b.token_ids.extend(c.seq.token_ids[start:end])
            b.positions.extend(range(start, end))
            b.query_lens.append(c.num_new_tokens)
            b.seq_lens.append(end)
            b.block_tables.append(list(c.seq.block_table))
            if c.completes:
                b.sample_rows.append(len(b.token_ids) - 1)
        return b


@torch.inference_mode()
def forward_batch(runner, batch: StepBatch) -> torch.Tensor | None:
    """Every rank: write this step's K/V into its own pool, run its shard; full logits of sample_rows.

    runner is a ModelRunner holding this rank's sharded model and KV pool. The
    collectives inside the model line the ranks up layer by layer.
    """
    runner.attach()
    dev = runner.device
    meta = AttentionMetadata.build(batch.query_lens, batch.seq_lens, batch.block_tables, runner.spec.block_size, dev)
    model = runner.model
    hidden = model.forward(torch.tensor(batch.token_ids, device=dev), torch.tensor(batch.positions, device=dev), meta)
    if not batch.sample_rows:
        return None
    return model.compute_logits(hidden[torch.tensor(batch.sample_rows, device=dev)])
