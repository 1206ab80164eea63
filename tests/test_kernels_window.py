"""Sliding-window attention (Gemma 3's local layers): Triton kernels and both backends vs plain PyTorch.

A query at position p sees keys in (p - window, p] (transformers' convention:
``kv_idx > q_idx - sliding_window``). The references apply that mask to a
dense softmax; one test checks the references themselves against an explicit
per-query loop, and that the window changes the result (so a kernel ignoring
it fails). Runs on a GPU when there is one, else under the Triton interpreter.
Tolerances as in test_kernels_prefill.py (fp32 1e-5).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from minillm.attention.metadata import AttentionMetadata  # noqa: E402
from minillm.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from minillm.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from minillm.kernels.paged_decode import (  # noqa: E402
    paged_decode_attention, paged_decode_attention_ref, paged_decode_attention_split,
)
from minillm.kernels.prefill import prefill_attention, prefill_attention_ref  # noqa: E402
from minillm.kernels.testing import assert_attention_close as assert_close  # noqa: E402
from minillm.kernels.testing import make_paged_workload  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def dense_windowed(q, k, v, qpos, scale, window):
    """One sequence, explicit loop over queries: q [Lq, H, D], k/v [n, H, D] (heads already repeated)."""
    out = torch.empty_like(q, dtype=torch.float32)
    for i, p in enumerate(qpos.tolist()):
        lo = max(0, p - window + 1)
        s = torch.einsum("hd,khd->hk", q[i].float(), k[lo : p + 1].float()) * scale
        out[i] = torch.einsum("hk,khd->hd", s.softmax(-1), v[lo : p + 1].float())
    return out


def test_references_match_explicit_loop_and_window_matters():
    h, kvh, d, bs, window = 4, 2, 16, 8, 7
    qlens, lens = [30, 12], [30, 41]  # a fresh prompt and a chunk after 29 cached keys
    w = make_paged_workload(qlens, lens, h, kvh, d, bs, torch.float32, seed=2)
    ref = prefill_attention_ref(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.3,
                                window=window)
    full = prefill_attention_ref(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.3)
    for s, (ql, n) in enumerate(zip(qlens, lens)):
        pos = torch.arange(n)
        blocks = torch.tensor(w.block_tables_list[s])[pos // bs]
        k = w.k_cache[blocks, pos % bs].repeat_interleave(h // kvh, 1)
        v = w.v_cache[blocks, pos % bs].repeat_interleave(h // kvh, 1)
        a = int(w.cu_seqlens_q[s])
        exp = dense_windowed(w.q[a : a + ql], k, v, torch.arange(n - ql, n), 0.3, window)
        torch.testing.assert_close(ref[a : a + ql], exp)
    assert (ref - full).abs().max() > 0.1  # queries past the window see fewer keys
    # decode reference: the last query of a sequence == the last prefill row
    dec = paged_decode_attention_ref(w.q[[29, 41]], w.k_cache, w.v_cache, w.block_tables, w.seq_lens, 0.3,
                                     window=window)
    torch.testing.assert_close(dec, ref[[29, 41]])


# (heads, kv_heads, head_dim, block_size, query_lens, seq_lens, window)
PREFILL_CASES = [
    (4, 2, 32, 16, [70, 40, 1], [70, 100, 33], 8),  # window far below the 64-key tile
    (2, 1, 16, 16, [130], [130], 64),  # window == BLOCK_N: tile-aligned edges
    (6, 2, 40, 32, [33, 65], [161, 65], 33),  # odd window, long cached prefix, padded lanes
    (4, 4, 16, 16, [20, 50], [20, 50], 1),  # a window of one: every query sees only itself
    (4, 1, 16, 16, [40], [90], 200),  # window longer than the context: same as no window
]


@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: f"w{c[6]}q{sum(c[4])}")
def test_prefill_window(case):
    h, kvh, d, bs, qlens, lens, window = case
    w = make_paged_workload(qlens, lens, h, kvh, d, bs, torch.float32, seed=window, device=DEV)
    ref = prefill_attention_ref(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.2,
                                window=window)
    out = torch.full_like(w.q, float("nan"))
    prefill_attention(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.2, out=out,
                      window=window)
    assert_close(out, ref, torch.float32)


def test_prefill_window_tile_boundaries():
    # chunks starting around multiples of the tiles, windows around them: off-by-ones in the
    # three key phases (window-masked, unmasked, causal) show up here
    ctxs = [0, 1, 31, 32, 33, 63, 64, 65, 127]
    case_q, case_l = [70] * len(ctxs), [c + 70 for c in ctxs]
    for window in (15, 16, 17, 63, 64, 65):
        w = make_paged_workload(case_q, case_l, 2, 1, 16, 16, torch.float32, seed=window, device=DEV)
        ref = prefill_attention_ref(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.25,
                                    window=window)
        out = prefill_attention(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.25,
                                window=window)
        assert_close(out, ref, torch.float32)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [1, 10, 64, 129, 1000])
def test_paged_decode_window(window, num_splits):
    h, kvh, d, bs, lens = 9, 3, 64, 16, [1, 9, 130, 300]
    w = make_paged_workload([1] * len(lens), lens, h, kvh, d, bs, torch.float32, seed=window, device=DEV)
    ref = paged_decode_attention_ref(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, 0.125, window=window)
    out = torch.full_like(w.q, float("nan"))
    if num_splits == 1:
        paged_decode_attention(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, 0.125, out=out, window=window)
    else:
        paged_decode_attention_split(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, 0.125, num_splits,
                                     out=out, window=window)
    assert_close(out, ref, torch.float32)


def reference_step(w, meta, scale, window):
    nd = meta.num_decode_seqs
    out = torch.empty_like(w.q)
    out[:nd] = paged_decode_attention_ref(w.q[:nd], w.k_cache, w.v_cache, w.block_tables[:nd], w.seq_lens[:nd],
                                          scale, window=window)
    cu = meta.cu_seqlens_q[nd:] - meta.cu_seqlens_q[nd]
    out[nd:] = prefill_attention_ref(w.q[nd:], w.k_cache, w.v_cache, cu, w.seq_lens[nd:], w.block_tables[nd:],
                                     scale, window=window)
    return out


@pytest.mark.parametrize("kv_dtype", [None, torch.int8])
@pytest.mark.parametrize("window", [5, 24])
def test_backends_mixed_step_window(window, kv_dtype):
    # decodes of different lengths (some shorter than the window), a chunk after a cached prefix, a fresh prompt
    h, kvh, d, bs = 4, 2, 32, 8
    qlens, lens = [1, 1, 1, 20, 37], [40, 3, 77, 52, 37]
    w = make_paged_workload(qlens, lens, h, kvh, d, bs, torch.float32, seed=window, device=DEV)
    w.k_cache.nan_to_num_(0.0)  # the torch decode path multiplies masked (p = 0) padding values
    w.v_cache.nan_to_num_(0.0)
    meta = AttentionMetadata.build(qlens, lens, w.block_tables_list, bs, device=DEV)
    outs = {}
    for backend in (TorchAttentionBackend(), TritonAttentionBackend()):
        kc, vc = w.k_cache.clone(), w.v_cache.clone()
        scales = {}
        if kv_dtype is not None:
            kc, vc = kc.to(kv_dtype), vc.to(kv_dtype)
            shape = kc.shape[:3]
            scales = dict(k_scale=torch.ones(shape, device=DEV), v_scale=torch.ones(shape, device=DEV))
        m = AttentionMetadata.build(qlens, lens, w.block_tables_list, bs, device=DEV)
        backend.prepare(m, bs, kvh, kv_dtype is not None)
        outs[backend.name] = backend.forward(w.q, w.k_new, w.v_new, kc, vc, m, 0.2, window=window, **scales)
        if kv_dtype is None:
            assert_close(outs[backend.name], reference_step(w, meta, 0.2, window), torch.float32)
    torch.testing.assert_close(outs["triton"], outs["torch"], atol=1e-5, rtol=1e-5)
