"""The attention backend interface: store this step's K/V, then attend through the block tables.

The executor calls `prepare(meta, ...)` once per step before the forward (per-step
state every layer reuses, e.g. the decode gather indices), then every attention
layer calls `forward`. An int8/fp8 cache passes its per-token-per-head scales;
a float cache passes None for both. A sliding-window layer (Gemma 3's local
layers) passes ``window``: a query at position p attends only to keys at
positions in (p - window, p], transformers' convention; None is full causal
attention. Every key stays in the cache either way, so chunked prefill and
prefix caching need nothing special.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from minillm.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    name: str

    def prepare(self, meta: AttentionMetadata, block_size: int, num_kv_heads: int, quantized: bool) -> None:
        """Derive this step's shared state into `meta` (eager steps only; a compiled step derives it in-graph)."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp32 (int8/fp8 caches)
        v_scale: torch.Tensor | None = None,
        window: int | None = None,  # sliding window in positions (see the module docstring)
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...
