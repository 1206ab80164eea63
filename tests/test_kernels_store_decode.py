"""Triton KV store and paged decode kernels vs their plain-PyTorch references.

Runs on a GPU when there is one, else under the Triton interpreter on CPU.
Caches are NaN outside the written slots and outputs are NaN before the run,
so a kernel that reads a slot it should not, or leaves an element unwritten,
fails. Tolerances (max |out - ref| <= atol + rtol * |ref|), per output dtype:
fp32 1e-5 (both sides compute in fp32; only summation order differs);
fp16 3e-3 and bf16 2e-2 (one to a few ulps of the output dtype: the reference
rounds once from fp32, on a GPU the kernel also rounds P to the dtype for the
tensor-core dot).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from minillm.kernels.kv_store import store_kv_cache, store_kv_cache_ref  # noqa: E402
from minillm.kernels.paged_decode import (  # noqa: E402
    paged_decode_attention, paged_decode_attention_ref, paged_decode_attention_split,
)
from minillm.kernels.testing import assert_attention_close as assert_close  # noqa: E402
from minillm.kernels.testing import make_paged_workload  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]



# ---------------------------------------------------------------- KV store
@pytest.mark.parametrize("cache_dtype", DTYPES)
@pytest.mark.parametrize("src_dtype", [None, torch.float32, torch.float16])
def test_store_kv_cache(cache_dtype, src_dtype):
    src_dtype = src_dtype or cache_dtype
    g = torch.Generator().manual_seed(1)
    T, kvh, d, bs, nb = 45, 3, 40, 16, 9  # head_dim 40: padded lanes; T not a tile multiple
    # k and v as strided views of one fused projection output, as a model produces them
    kv = torch.randn(T, 2, kvh, d + 8, generator=g).to(src_dtype).to(DEV)
    k, v = kv[:, 0, :, :d], kv[:, 1, :, :d]
    slots = torch.randperm(nb * bs, generator=g)[:T].to(DEV)
    slots[[3, 17]] = -1  # padding tokens: must not be written
    kc = torch.full((nb, bs, kvh, d), float("nan"), dtype=cache_dtype, device=DEV)
    vc = kc.clone()
    kr, vr = kc.clone(), vc.clone()
    store_kv_cache(k, v, kc, vc, slots)
    store_kv_cache_ref(k, v, kr, vr, slots)
    # a copy plus a round-to-nearest-even cast: bit-exact, NaN where nothing was written
    assert torch.equal(kc.isnan(), kr.isnan()) and torch.equal(vc.isnan(), vr.isnan())
    assert torch.equal(kc.nan_to_num(0), kr.nan_to_num(0)) and torch.equal(vc.nan_to_num(0), vr.nan_to_num(0))


# ---------------------------------------------------------------- paged decode
# (heads, kv_heads, head_dim, block_size, seq_lens): GQA ratios 1, 3 (9:3, the default model), 8 (MQA)
DECODE_CASES = [
    (4, 4, 32, 16, [1, 17, 130]),
    (9, 3, 64, 16, [300, 5, 64, 129]),
    (8, 1, 16, 32, [33, 200]),
    (6, 2, 40, 32, [77]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"h{c[0]}kv{c[1]}d{c[2]}bs{c[3]}")
def test_paged_decode(case, dtype):
    h, kvh, d, bs, lens = case
    w = make_paged_workload([1] * len(lens), lens, h, kvh, d, bs, dtype, seed=len(lens) + d, device=DEV)
    scale = d**-0.5
    ref = paged_decode_attention_ref(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, scale)
    out = torch.full_like(w.q, float("nan"))
    paged_decode_attention(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, scale, out=out)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [2, 5])
def test_paged_decode_split(dtype, num_splits):
    # 5 splits of a 3-key sequence: most splits are empty and must weigh nothing
    h, kvh, d, bs, lens = 9, 3, 64, 16, [3, 150, 260]
    w = make_paged_workload([1] * len(lens), lens, h, kvh, d, bs, dtype, seed=num_splits, device=DEV)
    scale = d**-0.5
    ref = paged_decode_attention_ref(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, scale)
    out = torch.full_like(w.q, float("nan"))
    paged_decode_attention_split(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, scale, num_splits, out=out)
    assert_close(out, ref, dtype)


def test_decode_reference_matches_dense_softmax():
    # the reference itself vs a dense formula on a contiguous copy (guards the guard)
    w = make_paged_workload([1, 1], [20, 7], 4, 2, 16, 16, torch.float32, seed=3)
    ref = paged_decode_attention_ref(w.q, w.k_cache, w.v_cache, w.block_tables, w.seq_lens, 0.25)
    for b, n in enumerate(w.seq_lens_list):
        pos = torch.arange(n)
        blocks = torch.tensor(w.block_tables_list[b])[pos // 16]
        k = w.k_cache[blocks, pos % 16]  # [n, 2, 16]
        v = w.v_cache[blocks, pos % 16]
        for hh in range(4):
            p = torch.softmax(k[:, hh // 2] @ w.q[b, hh] * 0.25, 0)
            torch.testing.assert_close(ref[b, hh], p @ v[:, hh // 2])


def test_num_splits_only_when_the_batch_leaves_sms_idle(monkeypatch):
    """Flash-decoding splits pay only while (sequence, kv head) programs are fewer than the SMs (H200 sweep)."""
    from minillm.kernels import paged_decode as pd

    monkeypatch.setattr(pd, "interpreting", lambda: False)
    assert pd.choose_num_splits(32, 8, 4096, num_sms=132) == 1  # 256 programs already cover 132 SMs
    assert pd.choose_num_splits(16, 8, 4096, num_sms=132) == 3  # 128 programs: ~2 per SM after splitting
    assert pd.choose_num_splits(8, 8, 4096, num_sms=132) == 5
    assert pd.choose_num_splits(1, 8, 16384, num_sms=132) == 33
    assert pd.choose_num_splits(1, 8, 600, num_sms=132) == 2  # >= 256 keys per split
    assert pd.choose_num_splits(1, 8, 100, num_sms=132) == 1
