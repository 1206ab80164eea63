"""The torch attention backend with the CPU's C++ kernels in three places (the base class marks them).

Decode rows over a float32/bfloat16 cache go to a C++ kernel that reads K/V through the block
tables in place (minillm/cpu/kernels/paged_attention.cpp): the base class's gather copies every K/V row
first, which at batch 64+ is most of a step's memory traffic. A verify step's short chunks join
the decode rows as rows of the same call (a causal chunk of lq rows is lq decode queries), and so
does a draft tree's chunk, each node reading its root-to-node path from the chunk's slots: no
gather and no mask per layer. A whole causal prompt runs FlashAttention's loop in C++
(minillm/cpu/kernels/prefill_attention.cpp), 1.6-3.8x SDPA on short prompts. Everything else, and any
input a kernel does not take (int8/fp8 caches, other dtypes), is the base class's code.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.attention.metadata import AttentionMetadata
from minillm.attention.torch_backend import TorchAttentionBackend
from minillm.cpu.kernels import paged_attention_cpu as cpu_paged
from minillm.cpu.kernels import prefill_attention_cpu as cpu_prefill


@dataclass
class KernelRows:
    """The first `seqs` sequences of a step -- the decode rows, then each short chunk right after them
    that follows cached keys -- as `rows` rows of one paged-decode call: per row its sequence's block
    table and its own length (query i of a chunk sees the keys up to its position)."""

    seqs: int
    rows: int
    tables: torch.Tensor  # int32 [rows, max_blocks]
    lens: torch.Tensor  # [rows]
    # a draft tree among them: per row the pool slots of its last keys (int64 [rows, T], right-aligned,
    # -1 = none), a node's root-to-node path read from the scratch slots it was written to; None: no tree
    tails: torch.Tensor | None = None


MAX_CHUNK_AS_ROWS = 16  # longer chunks (prefill) attend faster through SDPA than as separate decode rows


def kernel_rows(meta: AttentionMetadata) -> KernelRows | None:
    """The decode rows, then each following short causal chunk over cached keys, as
    rows of one paged-decode call. Row i of a chunk of lq rows ending at length sl is a decode query at
    length sl - lq + 1 + i: the same keys, the same mask (and window) as the chunk's own attention.

    A draft tree's chunk (spec_decode/tree.py) joins too: the row of a node at depth d sees the
    sl - lq cached keys, the root and its path, so it is a decode query of length sl - lq + 1 + d
    whose last 1 + d keys are read from the slots the chunk wrote them to (tree_tails)."""
    nd, covered = meta.num_decode_seqs, meta.num_decode_seqs
    tables, lens = [meta.block_tables[:nd]], [meta.seq_lens[:nd]]
    tails: list[tuple[int, torch.Tensor]] = []  # (first kernel row, its tree's tails) per tree chunk
    seqs = nd
    for i in range(nd, meta.num_seqs):
        lq, sl = meta.query_lens_list[i], meta.seq_lens_list[i]
        if lq > MAX_CHUNK_AS_ROWS or lq == sl:
            break  # a prefill chunk: it keeps the chunk path, as do the chunks after it
        tables.append(meta.block_tables[i : i + 1].expand(lq, -1))
        if meta.tree_seqs is not None and meta.tree_seqs[i]:
            seen = meta.tree_mask[covered : covered + lq, :lq]  # root, ancestors, itself
            lens.append((sl - lq + seen.sum(1)).to(meta.seq_lens.dtype))
            tails.append((covered, tree_tails(seen, meta.slot_mapping[covered : covered + lq])))
        else:
            lens.append(torch.arange(sl - lq + 1, sl + 1, dtype=meta.seq_lens.dtype))
        covered, seqs = covered + lq, i + 1
    if seqs == nd:
        return None
    rows = KernelRows(seqs, covered, torch.cat(tables).to(torch.int32), torch.cat(lens))
    if tails:
        width = max(t.shape[1] for _, t in tails)
        rows.tails = torch.full((covered, width), -1, dtype=torch.int64)
        for row, t in tails:
            rows.tails[row : row + t.shape[0], width - t.shape[1]:] = t
    return rows


def tree_tails(seen: torch.Tensor, chunk_slots: torch.Tensor) -> torch.Tensor:
    """int64 [lq, lq]: per row of a tree chunk, the slots of the chunk keys it sees (seen [lq, lq] bool),
    in chunk order (parents come before children, so that is depth order), right-aligned, -1 before."""
    lq = seen.shape[0]
    out = torch.full((lq, lq), -1, dtype=torch.int64)
    for r in range(lq):
        keys = chunk_slots[seen[r]]
        out[r, lq - keys.shape[0]:] = keys
    return out


class CpuAttentionBackend(TorchAttentionBackend):
    name = "torch"  # the same backend, faster: EngineConfig names "torch"

    def prepare(self, meta: AttentionMetadata, block_size: int, num_kv_heads: int, quantized: bool) -> None:
        super().prepare(meta, block_size, num_kv_heads, quantized)
        # available() builds the C++ kernel once, eagerly (a compiled graph only reads the result)
        if meta.block_tables.device.type == "cpu" and cpu_paged.available() and not quantized:
            meta.backend_state = kernel_rows(meta)  # decode rows and verify chunks as rows of one call

    def causal_kernel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor | None:
        return cpu_prefill.causal(q, k, v, scale) if cpu_prefill.applies(q, k) else None

    def attend_decode_static(self, q, k_cache, v_cache, meta, scale, window):
        if cpu_paged.applies(q, k_cache):
            return cpu_paged.paged_decode(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, window)
        return super().attend_decode_static(q, k_cache, v_cache, meta, scale, window)

    def attend_decode(self, q, k_cache, v_cache, meta, scale, window):
        if not cpu_paged.applies(q, k_cache):
            return super().attend_decode(q, k_cache, v_cache, meta, scale, window)
        rows = meta.backend_state
        if isinstance(rows, KernelRows):  # decode rows and verify chunks, in one call
            out = cpu_paged.paged_decode(q[:rows.rows], k_cache, v_cache, rows.tables, rows.lens, scale, window,
                                         rows.tails)
            return [out], rows.seqs, rows.rows
        nd = meta.num_decode_seqs
        if not nd:
            return [], 0, 0
        return [cpu_paged.paged_decode(q[:nd], k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, window)], nd, nd
