"""Attention tile by tile in PyTorch: the Triton prefill kernel's key loop, one tile per iteration.

`attention_backend="tiled"` is the torch backend with the softmax replaced by the online softmax
of FlashAttention (kernels/prefill.py): each sequence's keys are read through its block table
and visited in tiles of `TILE` keys; after each tile `online_softmax_update` folds the tile's
scores into a running max m, running sum l and unnormalised output acc, and the output is
acc / l at the end. The [queries, keys] probability matrix is never formed.

It exists to be read and to run exercise 04 (exercises/ex04_online_softmax.py) inside the real
engine: the backend calls the module name `online_softmax_update`, which
minillm.exercises.use("learner") rebinds to the learner's function. It is slow (a Python loop
per sequence, layer and tile) and reads float caches only, eagerly (no torch.compile, no CUDA
graphs); the torch and triton backends are the ones to serve with.

Natural-log units here (exp); the kernel works in base 2 (exp2, scores times log2 e), the same
recurrence.
"""
from __future__ import annotations

import torch

from minillm.attention.metadata import AttentionMetadata
from minillm.attention.torch_backend import TorchAttentionBackend, chunk_tree, gather_kv, store_kv

TILE = 32  # keys per tile: small, so a short prompt already takes several tiles


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor,
                          v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one tile of keys into the running softmax state of each query row.

    m [..., R] running max of the scores seen so far (-inf before any), l [..., R] running sum of
    exp(score - m), acc [..., R, D] running sum of exp(score - m) * v; scores [..., R, N] this
    tile's scaled scores (-inf where masked); v [..., N, D] this tile's values. Returns the new
    (m, l, acc). A row that has seen no visible key yet keeps m = -inf, l = 0, acc = 0 (no NaN).
    """
    m_new = torch.maximum(m, scores.amax(-1))
    m_safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)  # no -inf - -inf
    alpha = torch.exp(m - m_safe)  # how much the old state shrinks under the new max
    p = torch.exp(scores - m_safe[..., None])
    l = alpha * l + p.sum(-1)
    acc = alpha[..., None] * acc + torch.matmul(p, v)
    return m_new, l, acc


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    visible: torch.Tensor | None = None, tile: int = TILE) -> torch.Tensor:
    """q [Lq, H, D], k/v [L, kvh, D], visible [Lq, L] bool (None: all) -> [Lq, H, D], fp32 math."""
    lq, h, d = q.shape
    group = h // k.shape[1]
    qh = q.float().transpose(0, 1)  # [H, Lq, D]
    kh = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, L, D]
    vh = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    m = torch.full((h, lq), float("-inf"), device=q.device)
    l = torch.zeros((h, lq), device=q.device)
    acc = torch.zeros((h, lq, d), device=q.device)
    for n0 in range(0, k.shape[0], tile):
        s = torch.matmul(qh, kh[:, n0 : n0 + tile].transpose(-1, -2)) * scale  # [H, Lq, n]
        if visible is not None:
            s = s.masked_fill(~visible[None, :, n0 : n0 + tile], float("-inf"))
        m, l, acc = online_softmax_update(m, l, acc, s, vh[:, n0 : n0 + tile])
    return (acc / l[..., None]).transpose(0, 1).to(q.dtype)


def chunk_visibility(seq_len: int, lq: int, window: int | None, tree: tuple[torch.Tensor, torch.Tensor] | None,
                     device: torch.device) -> torch.Tensor:
    """[lq, seq_len] which keys each query of the chunk sees (causal, window, a tree's ancestors)."""
    ctx = seq_len - lq
    pos = torch.arange(seq_len, device=device)
    if tree is None:
        qpos, kpos = torch.arange(ctx, seq_len, device=device), pos
        visible = kpos[None, :] <= qpos[:, None]
    else:
        qpos = ctx + tree[1].long()
        kpos = torch.cat([pos[:ctx], qpos])
        visible = torch.cat([torch.ones((lq, ctx), dtype=torch.bool, device=device), tree[0]], dim=1)
    if window is not None:
        visible &= kpos[None, :] > qpos[:, None] - window
    return visible


class TiledAttentionBackend(TorchAttentionBackend):
    name = "tiled"

    def prepare(self, meta: AttentionMetadata, block_size: int, num_kv_heads: int, quantized: bool) -> None:
        if quantized:
            raise ValueError("the tiled attention backend reads float KV caches only")

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
        v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, window: int | None = None,
    ) -> torch.Tensor:
        if k_scale is not None or meta.static_shapes:
            raise ValueError("the tiled attention backend runs float KV caches eagerly only")
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        parts, start = [], 0
        for i in range(meta.num_seqs):  # decodes (one query) and prefill chunks alike
            lq, sl = meta.query_lens_list[i], meta.seq_lens_list[i]
            ki = gather_kv(k_cache, meta.block_tables[i : i + 1], sl)[0]
            vi = gather_kv(v_cache, meta.block_tables[i : i + 1], sl)[0]
            visible = chunk_visibility(sl, lq, window, chunk_tree(meta, i, start, lq), q.device)
            parts.append(tiled_attention(q[start : start + lq], ki, vi, scale, visible))
            start += lq
        return torch.cat(parts, dim=0)
