"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket (as vLLM and nano-vllm do).

A small model's decode step on a GPU is a few hundred short kernel launches;
launching them from Python costs more than running them. A CUDA graph records
the launches once and replays them with one call. A graph replays fixed
addresses and fixed shapes, so:

* every input lives in a static buffer (token ids, positions, the slot of each
  new K/V, keys per sequence, block tables) that is overwritten before a replay;
* the attention backends read shapes from those tensors only
  (``AttentionMetadata.static_shapes``), never from Python lists: a decode reads
  up to the longest context the block-table buffer can hold, masked by seq_lens;
* batch sizes are rounded up to a bucket (1, 2, 4, 8, 16, 32, ...); the padding
  rows are harmless sequences of one token whose K/V go to a scratch block no
  sequence owns. A batch above the largest bucket, a step with prefill or
  drafts, or a context longer than the buffers runs eagerly.

Graphs are captured largest bucket first, the smaller ones sharing its memory
pool. On a CPU there is nothing to capture: tests run the same buffers and
padding eagerly (``capture=False``) and check the real rows against an
unpadded step.
"""
from __future__ import annotations

import torch

from minillm.attention.metadata import AttentionMetadata
from minillm.engine.batch import StepBatch


def graph_buckets(max_num_seqs: int, largest: int = 512) -> list[int]:
    """1, 2, 4, 8, then every 16, up to max_num_seqs (and `largest`)."""
    top = min(max_num_seqs, largest)
    return [b for b in (1, 2, 4, 8) if b <= top] + list(range(16, top + 1, 16))


def bucket_for(num_seqs: int, buckets: list[int]) -> int | None:
    """The smallest bucket that holds num_seqs sequences, or None (run eagerly)."""
    return next((b for b in buckets if b >= num_seqs), None)


class DecodeGraphs:
    def __init__(self, model, block_size: int, max_model_len: int, max_num_seqs: int, scratch_block: int,
                 device: torch.device, capture: bool = True) -> None:
        self.model = model
        self.block_size = block_size
        self.buckets = graph_buckets(max_num_seqs)
        self.max_blocks = -(-max_model_len // block_size)
        self.scratch_block = scratch_block
        self.capture_graphs = capture
        n = self.buckets[-1] if self.buckets else 0
        self.token_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.zeros(n, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.full((n, self.max_blocks), scratch_block, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.num_replays = 0

    def meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_seqs=b, num_decode_seqs=b, cu_seqlens_q=self.cu_seqlens_q[: b + 1], seq_lens=self.seq_lens[:b],
            block_tables=self.block_tables[:b], slot_mapping=self.slot_mapping[:b], max_query_len=1,
            max_seq_len=self.max_blocks * self.block_size, query_lens_list=[1] * b,
            seq_lens_list=[self.max_blocks * self.block_size] * b, static_shapes=True)

    def fits(self, batch: StepBatch) -> bool:
        return (batch.is_decode_only and bucket_for(batch.num_seqs, self.buckets) is not None
                and all(len(t) <= self.max_blocks for t in batch.block_tables))

    def fill(self, batch: StepBatch, b: int) -> None:
        """Copy the step into the buffers' first rows; rows up to b become one-token scratch sequences."""
        n = batch.num_seqs
        dev = self.token_ids.device
        bs = self.block_size
        slots = [t[(L - 1) // bs] * bs + (L - 1) % bs for t, L in zip(batch.block_tables, batch.seq_lens)]
        pad = b - n
        scratch_slot = self.scratch_block * bs
        self.token_ids[:b].copy_(torch.tensor(batch.token_ids + [0] * pad, device=dev))
        self.positions[:b].copy_(torch.tensor(batch.positions + [0] * pad, device=dev))
        self.slot_mapping[:b].copy_(torch.tensor(slots + [scratch_slot] * pad, device=dev))
        self.seq_lens[:b].copy_(torch.tensor(batch.seq_lens + [1] * pad, dtype=torch.int32, device=dev))
        table = torch.full((b, self.max_blocks), self.scratch_block, dtype=torch.int32)
        for i, t in enumerate(batch.block_tables):
            table[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        self.block_tables[:b].copy_(table.to(dev))

    def _forward(self, b: int) -> torch.Tensor:
        return self.model.forward(self.token_ids[:b], self.positions[:b], self.meta(b))

    @torch.inference_mode()
    def capture(self) -> None:
        """Record one graph per bucket, largest first (the others share its memory pool)."""
        if not self.capture_graphs:
            return
        pool = None
        for b in reversed(self.buckets):
            self.seq_lens[:b].fill_(1)
            self.slot_mapping[:b].fill_(self.scratch_block * self.block_size)
            self.block_tables[:b].fill_(self.scratch_block)
            torch.cuda.synchronize()
            self._forward(b)  # warm-up outside the capture: allocations, Triton compilation and autotuning
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._forward(b)
            pool = graph.pool() if pool is None else pool
            self.graphs[b] = (graph, out)
        torch.cuda.synchronize()

    @torch.inference_mode()
    def run(self, batch: StepBatch) -> torch.Tensor:
        """Final hidden states of the batch's rows ([num_seqs, hidden]); the caller checked fits()."""
        b = bucket_for(batch.num_seqs, self.buckets)
        self.fill(batch, b)
        self.num_replays += 1
        if b in self.graphs:
            graph, out = self.graphs[b]
            graph.replay()
        else:  # no graph (a CPU, or capture off): the same buffers and padding, run eagerly
            out = self._forward(b)
        return out[: batch.num_seqs]
