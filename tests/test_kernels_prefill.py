"""Triton varlen prefill kernel and the Triton attention backend vs plain-PyTorch references.

Runs on a GPU when there is one, else under the Triton interpreter on CPU.
Caches are NaN outside the written slots and outputs NaN before the run.
Tolerances (max |out - ref| <= atol + rtol * |ref|), per output dtype: fp32
1e-5; fp16 3e-3; bf16 2e-2 (see test_kernels_store_decode.py for why).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from minillm.attention.metadata import AttentionMetadata  # noqa: E402
from minillm.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from minillm.kernels.kv_store import store_kv_cache_ref  # noqa: E402
from minillm.kernels.paged_decode import paged_decode_attention_ref  # noqa: E402
from minillm.kernels.prefill import prefill_attention, prefill_attention_ref  # noqa: E402
from minillm.kernels.testing import assert_attention_close as assert_close  # noqa: E402
from minillm.kernels.testing import make_paged_workload  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]



# (heads, kv_heads, head_dim, block_size, query_lens, seq_lens). Per sequence:
# qlen == seq_len is a fresh prompt, qlen < seq_len a later chunk or a prefix-cache hit.
PREFILL_CASES = [
    (9, 3, 64, 16, [5, 70, 1, 130], [5, 100, 33, 130]),  # default-model shape, GQA 3
    (4, 4, 32, 32, [65, 17], [65, 50]),  # MHA
    (8, 1, 16, 16, [40, 3], [95, 3]),  # MQA (GQA 8), head_dim 16
    (6, 2, 40, 32, [33], [161]),  # head_dim 40: padded lanes; long cached prefix
]


def run_prefill(case, dtype, seed=0):
    h, kvh, d, bs, qlens, lens = case
    w = make_paged_workload(qlens, lens, h, kvh, d, bs, dtype, seed=seed, device=DEV)
    scale = d**-0.5
    ref = prefill_attention_ref(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, scale)
    out = torch.full_like(w.q, float("nan"))
    prefill_attention(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, scale, out=out)
    return out, ref


@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: f"h{c[0]}kv{c[1]}d{c[2]}bs{c[3]}")
def test_prefill_fp32(case):
    out, ref = run_prefill(case, torch.float32)
    assert_close(out, ref, torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", PREFILL_CASES[:3], ids=lambda c: f"h{c[0]}kv{c[1]}d{c[2]}bs{c[3]}")
def test_prefill_half(case, dtype):
    out, ref = run_prefill(case, dtype, seed=1)
    assert_close(out, ref, dtype)


def test_prefill_tile_boundaries():
    # chunks starting just before, at and after multiples of 32/64/128 keys and spanning
    # more than one query tile: off-by-ones in the unmasked/masked split of the key loop
    # or in the last key of a tile show up here
    ctxs = [0, 1, 30, 31, 32, 33, 62, 63, 64, 65, 126, 127]
    qlens = [70] * len(ctxs)
    case = (2, 1, 16, 16, qlens, [c + 70 for c in ctxs])
    out, ref = run_prefill(case, torch.float32, seed=4)
    assert_close(out, ref, torch.float32)


def test_prefill_chunked_equals_whole():
    # one prompt in three chunks (each chunk sees the previous ones through the cache) == all at once
    h, kvh, d, bs, n = 4, 2, 32, 16, 90
    w = make_paged_workload([n], [n], h, kvh, d, bs, torch.float32, seed=5, device=DEV)
    whole = prefill_attention(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.2)
    parts = []
    for a, b in [(0, 31), (31, 32), (32, 90)]:
        cu = torch.tensor([0, b - a], dtype=torch.int32, device=DEV)
        sl = torch.tensor([b], dtype=torch.int32, device=DEV)
        parts.append(prefill_attention(w.q[a:b], w.k_cache, w.v_cache, cu, sl, w.block_tables, 0.2))
    torch.testing.assert_close(torch.cat(parts), whole, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- backend
def reference_forward(q, k, v, k_cache, v_cache, meta, scale):
    """Store with the reference, then decode and prefill references on their parts."""
    store_kv_cache_ref(k, v, k_cache, v_cache, meta.slot_mapping)
    nd = meta.num_decode_seqs
    out = torch.empty_like(q)
    if nd:
        out[:nd] = paged_decode_attention_ref(q[:nd], k_cache, v_cache, meta.block_tables[:nd],
                                              meta.seq_lens[:nd], scale)
    if nd < meta.num_seqs:
        cu = meta.cu_seqlens_q[nd:] - meta.cu_seqlens_q[nd]
        start = int(meta.cu_seqlens_q[nd])
        out[start:] = prefill_attention_ref(q[start:], k_cache, v_cache, cu, meta.seq_lens[nd:],
                                            meta.block_tables[nd:], scale)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_backend_mixed_step(dtype):
    # 3 decode sequences first, then a chunk after a cached prefix and a fresh prompt
    h, kvh, d, bs = 9, 3, 64, 16
    qlens, lens = [1, 1, 1, 20, 37], [40, 1, 77, 52, 37]
    w = make_paged_workload(qlens, lens, h, kvh, d, bs, dtype, seed=7, device=DEV)
    # the step's new K/V are not in the cache yet: the backend must store them first
    kc, vc = w.k_cache.clone(), w.v_cache.clone()
    kc.view(-1, kvh, d)[w.slot_mapping] = float("nan")
    vc.view(-1, kvh, d)[w.slot_mapping] = float("nan")
    meta = AttentionMetadata.build(qlens, lens, w.block_tables_list, bs, device=DEV)
    assert meta.num_decode_seqs == 3 and torch.equal(meta.slot_mapping, w.slot_mapping)
    scale = d**-0.5
    kr, vr = kc.clone(), vc.clone()
    ref = reference_forward(w.q, w.k_new, w.v_new, kr, vr, meta, scale)
    backend = TritonAttentionBackend()
    assert backend.name == "triton"
    out = backend.forward(w.q, w.k_new, w.v_new, kc, vc, meta, scale)
    assert out.dtype == dtype and out.shape == w.q.shape
    assert torch.equal(kc.nan_to_num(0), kr.nan_to_num(0)) and torch.equal(vc.nan_to_num(0), vr.nan_to_num(0))
    assert_close(out, ref, dtype)


def test_triton_backend_matches_torch_backend():
    try:
        from minillm.attention.torch_backend import TorchAttentionBackend
    except ImportError:
        pytest.skip("torch backend not available")
    h, kvh, d, bs = 4, 2, 32, 32
    qlens, lens = [1, 1, 50, 9], [64, 3, 50, 70]
    w = make_paged_workload(qlens, lens, h, kvh, d, bs, torch.float32, seed=11, device=DEV)
    meta = AttentionMetadata.build(qlens, lens, w.block_tables_list, bs, device=DEV)
    # zeros, not NaN, in unused slots: the torch backend's batched decode multiplies
    # masked-out (p = 0) padding values, and 0 * NaN would poison its output
    w.k_cache.nan_to_num_(0.0)
    w.v_cache.nan_to_num_(0.0)
    kc, vc = w.k_cache.clone(), w.v_cache.clone()
    out_t = TorchAttentionBackend().forward(w.q, w.k_new, w.v_new, kc, vc, meta, 0.17)
    out = TritonAttentionBackend().forward(w.q, w.k_new, w.v_new, w.k_cache, w.v_cache, meta, 0.17)
    torch.testing.assert_close(out, out_t, atol=1e-5, rtol=1e-5)


def test_tiny_model_logits_triton_vs_torch_backend():
    # a whole (tiny, random, GQA 9:3, head_dim 8 -> padded to 16) model through both backends
    standalone = pytest.importorskip("minillm.models.standalone")
    from minillm.config import ModelConfig
    from minillm.models.llama import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=100, hidden_size=72, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=9, num_key_value_heads=3)
    model = LlamaForCausalLM(cfg, max_positions=128).eval().to(DEV)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ids = torch.randint(0, 100, (40,)).tolist()
    ref = standalone.forward_logits(model, ids)
    out = standalone.forward_logits(model, ids, backend=TritonAttentionBackend())
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
