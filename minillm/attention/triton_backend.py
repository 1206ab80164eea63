"""The Triton attention backend: the kernels in minillm.kernels behind the backend interface.

One step: store the new K/V into their slots, then run the paged decode kernel
on the first ``num_decode_seqs`` sequences (one query each) and the varlen
prefill kernel on the rest (prefill chunks, prefix-cache hits, speculative
verification, a tree of drafts with its tree mask). Both write straight into one
output tensor, so nothing is concatenated. On a GPU, decode splits long contexts across programs
(flash-decoding) when there are too few sequences to fill the device.

On CPU this runs under ``TRITON_INTERPRET=1`` (set it before triton is first
imported); that is for testing, the torch backend is the CPU fast path.

int8 / fp8 caches: each layer passes its scale pools (bound by engine/kv_cache.py)
and they are passed to the three kernels, which
quantize on store and dequantize on load. A sliding-window layer's ``window``
goes to both attention kernels, which then never read keys outside it.
"""
from __future__ import annotations

import torch

from minillm.attention.base import AttentionBackend
from minillm.attention.metadata import AttentionMetadata
from minillm.kernels.kv_store import store_kv_cache
from minillm.kernels.paged_decode import choose_num_splits, paged_decode_attention_split
from minillm.kernels.prefill import prefill_attention


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def __init__(self) -> None:
        self._num_sms: int | None = None

    def _sms(self, device: torch.device) -> int:
        if self._num_sms is None:
            self._num_sms = (torch.cuda.get_device_properties(device).multi_processor_count
                             if device.type == "cuda" else 1)
        return self._num_sms

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
        v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, window: int | None = None,
    ) -> torch.Tensor:
        sc = {"k_scale": k_scale, "v_scale": v_scale}
        store_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping, **sc)
        out = torch.empty_like(q)
        nd = meta.num_decode_seqs
        if nd:
            # a captured decode step reads no list: the longest context its block tables can hold
            max_len = (meta.block_tables.shape[1] * k_cache.shape[1] if meta.static_shapes
                       else max(meta.seq_lens_list[:nd]))
            keys = max_len if window is None else min(max_len, window)  # what each program reads at most
            splits = choose_num_splits(nd, k_cache.shape[2], keys, self._sms(q.device))
            paged_decode_attention_split(
                q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd], scale, splits, out=out[:nd],
                window=window, **sc,
            )
        if nd < meta.num_seqs:
            max_q = max(meta.query_lens_list[nd:])
            prefill_attention(
                q, k_cache, v_cache, meta.cu_seqlens_q, meta.seq_lens, meta.block_tables, scale,
                out=out, max_query_len=max_q, first_seq=nd, window=window, **sc,
                tree_mask=meta.tree_mask, tree_depth=meta.tree_depth,
            )
        return out
