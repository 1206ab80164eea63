"""Layers whose output needs the other ranks: row-parallel linear, vocab-parallel embedding and LM head.

Column-parallel layers (qkv_proj, gate_up_proj) need no class of their own: each
rank's shard is a plain nn.Linear holding some output rows, and its outputs stay
local (each rank attends with its own heads, gates its own MLP columns).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from minillm.parallel import comm


class RowParallelLinear(nn.Linear):
    """y = sum over ranks of x_r @ W_r^T: each rank holds some input columns; one all-reduce.

    o_proj takes this rank's heads, down_proj this rank's MLP columns. The bias
    (if any) is added by rank 0 only, so the sum counts it once.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.rank = rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias if self.rank == 0 else None)
        return comm.all_reduce(y)


class VocabParallelEmbedding(nn.Embedding):
    """Each rank holds rows [start, start + rows) of the table; ids elsewhere give zeros; all-reduce sums.

    embed_scale: Gemma's sqrt(hidden) factor of the embedding it replaces (models/layers.py
    ScaledEmbedding), applied to the rank's rows before the sum, in the weight's dtype as there.
    """

    def __init__(self, rows: int, hidden: int, start: int, vocab_size: int,
                 embed_scale: torch.Tensor | None = None) -> None:
        super().__init__(rows, hidden)
        self.start, self.vocab_size = start, vocab_size
        self.embed_scale = embed_scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.num_embeddings)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        if self.embed_scale is not None:
            x = x * self.embed_scale.to(device=x.device, dtype=self.weight.dtype)
        return comm.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0))


class ParallelLMHead(nn.Linear):
    """Each rank scores its slice of the vocabulary; an all-gather assembles the full logits row.

    Slices are padded to equal size (all-gather needs equal shapes); the padding
    columns are cut off after gathering.
    """

    def __init__(self, hidden: int, rows: int, vocab_size: int) -> None:
        super().__init__(hidden, rows, bias=False)
        self.vocab_size = vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return comm.all_gather_last_dim(F.linear(x, self.weight))[..., : self.vocab_size]
