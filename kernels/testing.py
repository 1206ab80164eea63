"""Random paged-KV workloads for the kernel tests and the GPU bench.

A workload is a packed batch in the engine's layout: ``query_lens[s]`` new
tokens for sequence ``s`` that has ``seq_lens[s]`` keys after the step. Its
cache pool is filled with NaN, then every key position of every sequence is
written through a shuffled block table; block 0 is never handed out, so the
zero padding of the block tables points at a NaN block. A kernel that reads a
slot it should not (past ``seq_len``, padding, another sequence's page) turns
its output into NaN and fails the comparison.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedWorkload:
    q: torch.Tensor  # [T, H, D]
    k_new: torch.Tensor  # [T, kvh, D] this step's keys (already in the cache)
    v_new: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, kvh, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [S, max_blocks]
    seq_lens: torch.Tensor  # int32 [S]
    cu_seqlens_q: torch.Tensor  # int32 [S + 1]
    slot_mapping: torch.Tensor  # int64 [T]
    query_lens: list[int]
    seq_lens_list: list[int]
    block_tables_list: list[list[int]]


def make_paged_workload(
    query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
    block_size: int, dtype: torch.dtype, seed: int = 0, device: str | torch.device = "cpu", spare_blocks: int = 3,
) -> PagedWorkload:
    g = torch.Generator().manual_seed(seed)
    nblocks = [-(-n // block_size) for n in seq_lens]
    pool = 1 + sum(nblocks) + spare_blocks  # block 0: never used, NaN
    perm = (torch.randperm(pool - 1, generator=g) + 1).tolist()  # shuffled, non-contiguous pages
    tables, i = [], 0
    for n in nblocks:
        tables.append(perm[i : i + n])
        i += n
    shape = (pool, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    slots_all, new_rows = [], []
    for s, (n, qlen) in enumerate(zip(seq_lens, query_lens)):
        for pos in range(n):
            slot = tables[s][pos // block_size] * block_size + pos % block_size
            slots_all.append(slot)
            if pos >= n - qlen:
                new_rows.append(len(slots_all) - 1)
    total = len(slots_all)
    k_all = torch.randn(total, num_kv_heads, head_dim, generator=g).to(dtype)
    v_all = torch.randn(total, num_kv_heads, head_dim, generator=g).to(dtype)
    slots = torch.tensor(slots_all, dtype=torch.int64)
    k_cache.view(-1, num_kv_heads, head_dim)[slots] = k_all
    v_cache.view(-1, num_kv_heads, head_dim)[slots] = v_all
    rows = torch.tensor(new_rows, dtype=torch.int64)
    max_blocks = max(max(nblocks), 1)
    bt = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    for s, t in enumerate(tables):
        bt[s, : len(t)] = torch.tensor(t, dtype=torch.int32)
    cu = [0]
    for qlen in query_lens:
        cu.append(cu[-1] + qlen)
    q = torch.randn(cu[-1], num_heads, head_dim, generator=g).to(dtype)
    dev = torch.device(device)
    return PagedWorkload(
        q=q.to(dev), k_new=k_all[rows].to(dev), v_new=v_all[rows].to(dev),
        k_cache=k_cache.to(dev), v_cache=v_cache.to(dev), block_tables=bt.to(dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev),
        slot_mapping=slots[rows].to(dev), query_lens=list(query_lens), seq_lens_list=list(seq_lens),
        block_tables_list=tables,
    )


def gather_rows(cache: torch.Tensor, scales: torch.Tensor | None, blocks: torch.Tensor,
                offsets: torch.Tensor) -> torch.Tensor:
    """The references' read of cache rows (block, offset) -> fp32 [n, kvh, D]; dequantized when scaled."""
    rows = cache[blocks, offsets]
    if scales is None:
        return rows.float()
    from minillm.attention.kv_quant import dequantize_kv

    return dequantize_kv(rows, scales[blocks, offsets], torch.float32)


def quantize_workload(w: PagedWorkload,
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The workload's caches quantized per (slot, head) to int8 / float8_e4m3fn.

    Returns (k_codes, v_codes, k_scale, v_scale). Unwritten (NaN) slots get NaN
    scales, so a kernel that reads one still produces NaN and fails."""
    from minillm.attention.kv_quant import quantize_kv

    out = []
    for cache in (w.k_cache, w.v_cache):
        nb, bs, kvh, d = cache.shape
        flat = cache.reshape(-1, kvh, d)
        nan = flat.isnan().any(-1)  # [slots, kvh]
        codes, scales = quantize_kv(flat.nan_to_num(0.0), dtype)
        out.append((codes.view(nb, bs, kvh, d), scales.masked_fill(nan, float("nan")).view(nb, bs, kvh)))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def max_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest absolute difference; NaN anywhere (an unwritten or poisoned element) gives inf."""
    d = (out.float() - ref.float()).abs()
    return float("inf") if torch.isnan(d).any() else float(d.max()) if d.numel() else 0.0


# Attention-kernel tolerances per cache dtype (atol, rtol). fp16/bf16 leave room for a GPU,
# which rounds probabilities to half precision before the second matmul.
ATTENTION_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (3e-3, 3e-3), torch.bfloat16: (2e-2, 2e-2)}


def assert_attention_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = ATTENTION_TOL[dtype]
    assert not torch.isnan(out).any(), "NaN in output: unwritten element or poisoned slot read"
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


def full_paged_pool(
    batch: int, ctx: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
    device: str | torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the perf reports: `batch` sequences of `ctx` keys each, pages shuffled across the pool.

    Returns k_cache, v_cache, block_tables (int32 [batch, blocks]) and seq_lens (int32 [batch]).
    """
    nblk = -(-ctx // block_size)
    pool = batch * nblk + 1
    kc = torch.randn(pool, block_size, kv_heads, head_dim, dtype=dtype, device=device)
    vc = torch.randn_like(kc)
    bt = torch.randperm(pool, device=device)[: batch * nblk].view(batch, nblk).to(torch.int32)
    sl = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    return kc, vc, bt, sl
