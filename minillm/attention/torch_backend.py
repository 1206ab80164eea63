"""The reference attention backend in plain PyTorch.

A fast path may subclass it (the CPU one does: minillm/cpu/attention.py) and
replace three steps, each marked below: the decode rows (`attend_decode`), the
decode rows of a compiled step (`attend_decode_static`) and a whole causal
prompt (`causal_kernel`). The code here is their reference.

Decode sequences are batched: the flat pool slot of every key they attend to
is computed once per step from the block tables, each layer gathers its keys
with one index_select straight into a padded [batch, kv_heads, max_len,
head_dim] tensor, and attends with two batched matmuls around a float32
softmax (each K/V head serves its whole group of query heads, no
repeat_interleave). Sequences shorter than the longest are masked; a batch of
equal lengths (e.g. batch 1) needs no mask.
Prefill chunks go one sequence at a time through scaled_dot_product_attention;
a chunk that starts at position 0 with nothing cached uses its own K/V and the
fused causal kernel of scaled_dot_product_attention, a chunk after a cached prefix reads the prefix
through the block table and uses an explicit offset-causal mask.

Sliding-window layers (``window``): a decode gathers only each sequence's last
``window`` keys (its own slots and mask, derived once per step per window); a
prefill chunk drops the keys no query of it can see and masks
``q_pos - window < k_pos <= q_pos``.
A chunk verifying a tree of drafts (metadata.tree_mask) gets an explicit mask:
the keys before the chunk, then the root and the query's own ancestors.

Quantized caches (int8 / fp8 with per-token-per-head scales, see kv_quant.py)
take a separate path so the float path stays as it is: new K/V are quantized
on store, and attention always reads the dequantized values -- for cached
prefixes and for a prompt's own fresh K/V alike -- so a prompt attends to the
same keys whether it was prefilled whole, in chunks or from the prefix cache.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from minillm.attention.base import AttentionBackend
from minillm.attention.kv_quant import as_bits, dequantize_kv, quantize_kv
from minillm.attention.metadata import AttentionMetadata

# a fused causal attention (q [L, H, D], k/v [L, kvh, D], scale) -> [L, H, D], or None where it does not apply
CausalKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], "torch.Tensor | None"]


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Write each new token's K/V into its slot of the paged pool."""
    kvh, d = k.shape[1], k.shape[2]
    k_cache.view(-1, kvh, d).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, kvh, d).index_copy_(0, slots, v.to(v_cache.dtype))


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[seqs, blocks] table -> [seqs, num_tokens, kv_heads, head_dim] contiguous keys or values."""
    nb = -(-num_tokens // cache.shape[1])
    blocks = cache[block_tables[:, :nb]]  # [seqs, nb, block_size, kvh, d]
    s = blocks.shape
    return blocks.reshape(s[0], s[1] * s[2], s[3], s[4])[:, :num_tokens]


def decode_gather_slots(block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int, block_size: int,
                        masked: bool, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Flat pool slot of every (sequence, key position), and the padding mask.

    Computed once per step and shared by all layers: each layer then gathers
    its keys with a single index_select. Padding positions point into block 0
    and are masked out. With ``window`` < max_len only each sequence's last
    ``window`` keys are listed (from max(0, seq_len - window) on).
    """
    if window is None or window >= max_len:
        pos = torch.arange(max_len, device=block_tables.device)
        slots = block_tables[:, pos // block_size].long() * block_size + pos % block_size  # [B, L]
        mask = (pos[None, :] < seq_lens[:, None])[:, None, None, :] if masked else None
        return slots.reshape(-1), mask
    start = (seq_lens.long() - window).clamp_min(0)
    pos = start[:, None] + torch.arange(window, device=block_tables.device)[None, :]  # [B, window], in the table
    slots = block_tables.gather(1, pos // block_size).long() * block_size + pos % block_size
    mask = (pos < seq_lens[:, None])[:, None, None, :] if masked else None
    return slots.reshape(-1), mask


def decode_head_rows(slots: torch.Tensor, batch: int, kv_heads: int) -> torch.Tensor:
    """Flat slots [B * L] -> row of every (sequence, kv head, key position) in a cache seen as [-1, head_dim].

    Gathering these rows yields the keys already in the [B, kv_heads, L, head_dim]
    layout the attention matmuls read, so no transposing copy follows the gather
    (that copy cost as much as the gather itself)."""
    heads = torch.arange(kv_heads, device=slots.device).view(1, kv_heads, 1)
    return (slots.view(batch, 1, -1) * kv_heads + heads).reshape(-1)


def paged_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor,
    mask: torch.Tensor | None, scale: float,
) -> torch.Tensor:
    """q: [B, H, D], one query per sequence; rows: from decode_head_rows, [B * kvh * L]."""
    b, h, d = q.shape
    kvh = k_cache.shape[2]
    keys = k_cache.view(-1, d).index_select(0, rows).view(b, kvh, -1, d)  # [B, kvh, L, D], contiguous
    vals = v_cache.view(-1, d).index_select(0, rows).view(b, kvh, -1, d)
    if keys.dtype != q.dtype:
        keys, vals = keys.to(q.dtype), vals.to(q.dtype)
    return decode_attend(q, keys, vals, mask, scale)


def decode_attend(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor | None,
                  scale: float) -> torch.Tensor:
    """q: [B, H, D]; keys/vals: [B, kvh, L, D] in q's dtype -> [B, H, D].

    Two batched matmuls in the storage dtype around a float32 softmax, the query
    heads of a group sharing one K/V head (no repeat). With one query per
    sequence CPU SDPA is slower than this in both dtypes (fp32 ~1.6x, bf16 far
    more with a mask)."""
    b, h, d = q.shape
    kvh = keys.shape[1]
    qg = q.view(b, kvh, h // kvh, d)
    scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * scale  # [B, kvh, g, L]
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    probs = scores.softmax(-1).to(q.dtype)
    return torch.matmul(probs, vals).reshape(b, h, d)


def prefill_one(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int, scale: float, window: int | None = None,
    causal: CausalKernel | None = None,
) -> torch.Tensor:
    """q: [Lq, H, D] (the last Lq positions), k/v: [seq_len, kvh, D] -> [Lq, H, D].
    causal: a backend's own kernel for a whole causal prompt, tried first."""
    lq = q.shape[0]
    ctx = seq_len - lq  # position of the first query
    windowed = window is not None and window < seq_len  # else no query can miss a key
    lo = max(0, ctx - window + 1) if windowed else 0  # no query of this chunk sees keys below lo
    k, v = k[lo:], v[lo:]
    if lq == seq_len and not windowed and causal is not None:
        out = causal(q, k, v, scale)
        if out is not None:
            return out
    qt, kt, vt = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if lq == seq_len and not windowed:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=True)
    else:
        # query i sits at absolute position ctx + i and sees keys <= that (and > that - window)
        qpos = torch.arange(ctx, seq_len, device=q.device)[:, None]
        kpos = torch.arange(lo, seq_len, device=q.device)[None, :]
        mask = kpos <= qpos
        if windowed:
            mask &= kpos > qpos - window
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def prefill_tree(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int, scale: float,
    chunk_mask: torch.Tensor, depth: torch.Tensor, window: int | None = None,
) -> torch.Tensor:
    """A tree-verify chunk (spec_decode/tree.py): q [Lq, H, D]; k/v [seq_len, kvh, D].

    Query i sees every key before the chunk and the chunk's keys j with chunk_mask[i, j];
    a window counts from its real position ctx + depth[i], not from its slot."""
    lq = q.shape[0]
    ctx = seq_len - lq
    qpos = ctx + depth.long()[:, None]
    kpos = torch.cat([torch.arange(ctx, device=q.device), ctx + depth.long()])[None, :]
    mask = torch.cat([torch.ones((lq, ctx), dtype=torch.bool, device=q.device), chunk_mask], dim=1)
    if window is not None:
        mask &= kpos > qpos - window
    qt, kt, vt = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def chunk_tree(meta: AttentionMetadata, seq: int, start: int, lq: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(chunk mask [lq, lq], depths [lq]) when packed sequence `seq` verifies a tree, else None."""
    if meta.tree_seqs is None or not meta.tree_seqs[seq]:
        return None
    return meta.tree_mask[start : start + lq, :lq], meta.tree_depth[start : start + lq]


def attend_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int, scale: float,
                 window: int | None, tree: tuple[torch.Tensor, torch.Tensor] | None,
                 causal: CausalKernel | None = None) -> torch.Tensor:
    if tree is None:
        return prefill_one(q, k, v, seq_len, scale, window, causal)
    return prefill_tree(q, k, v, seq_len, scale, tree[0], tree[1], window)


def store_kv_quant(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    k_scale: torch.Tensor, v_scale: torch.Tensor, slots: torch.Tensor,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Quantize each new token's K/V per head and write values and scales to its slot.

    Returns the quantized (values, scales) of K and of V, exactly what was stored."""
    kvh, d = k.shape[1], k.shape[2]
    kq, ks = quantize_kv(k, k_cache.dtype)
    vq, vs = quantize_kv(v, v_cache.dtype)
    as_bits(k_cache).view(-1, kvh, d).index_copy_(0, slots, as_bits(kq))
    as_bits(v_cache).view(-1, kvh, d).index_copy_(0, slots, as_bits(vq))
    k_scale.view(-1, kvh).index_copy_(0, slots, ks)
    v_scale.view(-1, kvh).index_copy_(0, slots, vs)
    return (kq, ks), (vq, vs)


def gather_dequant(cache: torch.Tensor, scales: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Flat slots [N] -> dequantized [N, kv_heads, head_dim] in ``dtype``."""
    kvh, d = cache.shape[2], cache.shape[3]
    vals = as_bits(cache).view(-1, kvh, d).index_select(0, slots).view(cache.dtype)
    return dequantize_kv(vals, scales.view(-1, kvh).index_select(0, slots), dtype)


def forward_quant(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    k_scale: torch.Tensor, v_scale: torch.Tensor, meta: AttentionMetadata, scale: float,
    window: int | None = None, causal: CausalKernel | None = None,
) -> torch.Tensor:
    """The int8/fp8 cache path: quantize on store, dequantize every key and value read."""
    (kq, ks), (vq, vs) = store_kv_quant(k, v, k_cache, v_cache, k_scale, v_scale, meta.slot_mapping)
    bs, kvh, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    if meta.static_shapes or torch.compiler.is_compiling():  # decode-only, tensors only (see TorchAttentionBackend)
        max_len = meta.block_tables.shape[1] * bs
        slots, mask = decode_gather_slots(meta.block_tables, meta.seq_lens, max_len, bs, masked=True, window=window)
        nd, lens = q.shape[0], None
    else:
        nd = meta.num_decode_seqs
        lens = meta.seq_lens_list[:nd]
    parts = []
    if nd:
        if lens is not None:
            slots, _, mask = decode_state(meta, window, bs, kvh, quantized=True)
        keys = gather_dequant(k_cache, k_scale, slots, q.dtype).view(nd, -1, kvh, d).transpose(1, 2)
        vals = gather_dequant(v_cache, v_scale, slots, q.dtype).view(nd, -1, kvh, d).transpose(1, 2)
        parts.append(decode_attend(q[:nd], keys, vals, mask, scale))
    if lens is None:
        return parts[0]
    start = nd
    for i in range(nd, meta.num_seqs):
        lq, sl = meta.query_lens_list[i], meta.seq_lens_list[i]
        if lq == sl:  # nothing cached before: the chunk's own K/V, as stored (quantized)
            ki = dequantize_kv(kq[start : start + lq], ks[start : start + lq], q.dtype)
            vi = dequantize_kv(vq[start : start + lq], vs[start : start + lq], q.dtype)
        else:
            pos = torch.arange(sl, device=q.device)
            table = meta.block_tables[i].long()
            slots_i = table[pos // bs] * bs + pos % bs
            ki = gather_dequant(k_cache, k_scale, slots_i, q.dtype)
            vi = gather_dequant(v_cache, v_scale, slots_i, q.dtype)
        parts.append(attend_chunk(q[start : start + lq], ki, vi, sl, scale, window, chunk_tree(meta, i, start, lq),
                                  causal))
        start += lq
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


def decode_state(meta: AttentionMetadata, window: int | None, block_size: int, num_kv_heads: int,
                 quantized: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(slots, rows, mask) of this step's decode keys for a layer with this window (eager steps).

    Full attention, or a window no decode sequence is longer than, shares the
    state prepare() derived; each shorter window is derived once, by its first layer."""
    if window is None:  # full attention: the hot path, nothing to derive
        return meta.decode_slots, meta.decode_rows, meta.decode_mask
    nd = meta.num_decode_seqs
    lens = meta.seq_lens_list[:nd]
    if window >= max(lens):
        return meta.decode_slots, meta.decode_rows, meta.decode_mask
    if window not in meta.decode_windowed:
        seen = [min(n, window) for n in lens]  # keys each sequence attends to
        slots, mask = decode_gather_slots(meta.block_tables[:nd], meta.seq_lens[:nd], max(lens), block_size,
                                          masked=min(seen) != max(seen), window=window)
        rows = None if quantized else decode_head_rows(slots, nd, num_kv_heads)
        meta.decode_windowed[window] = (slots, rows, mask)
    return meta.decode_windowed[window]


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    causal_kernel: CausalKernel | None = None  # a fast path's fused causal prompt attention; None: SDPA's

    def prepare(self, meta: AttentionMetadata, block_size: int, num_kv_heads: int, quantized: bool) -> None:
        """The decode keys' pool slots, computed once per step and shared by all layers."""
        nd = meta.num_decode_seqs
        if not nd:
            return
        lens = meta.seq_lens_list[:nd]
        meta.decode_slots, meta.decode_mask = decode_gather_slots(
            meta.block_tables[:nd], meta.seq_lens[:nd], max(lens), block_size, masked=min(lens) != max(lens))
        if not quantized:  # the float path gathers K/V rows already in [B, kvh, L, D] order
            meta.decode_rows = decode_head_rows(meta.decode_slots, nd, num_kv_heads)

    def attend_decode_static(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             meta: AttentionMetadata, scale: float, window: int | None) -> torch.Tensor:
        """A decode-only step from tensors alone (torch.compile, a captured CUDA graph): no Python lists,
        so one graph serves every batch size and context length."""
        bs = k_cache.shape[1]
        max_len = meta.block_tables.shape[1] * bs
        slots, mask = decode_gather_slots(meta.block_tables, meta.seq_lens, max_len, bs, masked=True, window=window)
        rows = decode_head_rows(slots, q.shape[0], k_cache.shape[2])
        return paged_decode(q, k_cache, v_cache, rows, mask, scale)

    def attend_decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                      scale: float, window: int | None) -> tuple[list[torch.Tensor], int, int]:
        """The step's decode rows: (outputs, first sequence left for the chunk path, its first row)."""
        nd = meta.num_decode_seqs
        if not nd:
            return [], 0, 0
        _, rows, mask = decode_state(meta, window, k_cache.shape[1], k_cache.shape[2], quantized=False)
        return [paged_decode(q[:nd], k_cache, v_cache, rows, mask, scale)], nd, nd

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
        v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, window: int | None = None,
    ) -> torch.Tensor:
        static = meta.static_shapes or torch.compiler.is_compiling()
        if meta.num_decode_seqs and meta.decode_slots is None and not static:
            # a direct caller (a test) that skipped prepare(): derive the step's state now
            self.prepare(meta, k_cache.shape[1], k_cache.shape[2], k_scale is not None)
        if k_scale is not None:  # int8 / fp8 cache: the pool binds each layer's scales (engine/kv_cache.py)
            return forward_quant(q, k, v, k_cache, v_cache, k_scale, v_scale, meta, scale, window, self.causal_kernel)
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        if static:  # the runner sends only decode-only batches here
            return self.attend_decode_static(q, k_cache, v_cache, meta, scale, window)
        parts, first, start = self.attend_decode(q, k_cache, v_cache, meta, scale, window)
        for i in range(first, meta.num_seqs):
            lq, sl = meta.query_lens_list[i], meta.seq_lens_list[i]
            qi = q[start : start + lq]
            if lq == sl:  # nothing cached before this chunk: use the fresh K/V directly
                ki, vi = k[start : start + lq], v[start : start + lq]
            else:
                ki = gather_kv(k_cache, meta.block_tables[i : i + 1], sl)[0].to(q.dtype)
                vi = gather_kv(v_cache, meta.block_tables[i : i + 1], sl)[0].to(q.dtype)
            parts.append(attend_chunk(qi, ki, vi, sl, scale, window, chunk_tree(meta, i, start, lq), self.causal_kernel))
            start += lq
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
