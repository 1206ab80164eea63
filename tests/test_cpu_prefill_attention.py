"""The C++ causal prefill attention (minillm/cpu/kernels/prefill_attention.cpp) against torch's SDPA.

SDPA with is_causal=True is the reference: for any prompt length (one key block or many, a
short last block), GQA group and head_dim the kernel takes, the outputs agree to float32
rounding; a whole engine gives the same greedy tokens with the kernel on and off.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from minillm.attention import torch_backend
from minillm.cpu.attention import CpuAttentionBackend
from minillm.cpu.kernels import prefill_attention_cpu as cpu_prefill
from tests.helpers.engine_utils import serve_growing_prompts, tiny_model

if not cpu_prefill.available():
    pytest.skip("the C++ prefill attention could not be built here", allow_module_level=True)


@pytest.fixture(autouse=True)
def no_grad():
    """The engine runs under inference mode; a forward that records a graph keeps SDPA (applies())."""
    with torch.no_grad():
        yield


def sdpa(q, k, v, scale):
    qt, kt, vt = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=True)[0].transpose(0, 1)


def packed_qkv(length, heads, kv_heads, d, seed):
    """q, k, v as the model hands them on: strided views into one [L, (H + 2 KVH) D] projection."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(length, (heads + 2 * kv_heads) * d, generator=g) * 2
    q = qkv[:, : heads * d].view(length, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(length, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(length, kv_heads, d)
    return q, k, v


@settings(max_examples=40, deadline=None)
@given(length=st.sampled_from([1, 2, 15, 16, 17, 31, 33, 64, 100, 257]), kv_heads=st.sampled_from([1, 2, 3]),
       group=st.sampled_from([1, 3, 4]), dim_vectors=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**16))
def test_kernel_equals_sdpa(length, kv_heads, group, dim_vectors, seed):
    """Lengths around the 16-query blocks and the key blocks (two vectors of keys), one to four vectors of
    head_dim (16 to 64 floats with AVX2, 16 to 64 x 2 with AVX-512)."""
    d = dim_vectors * cpu_prefill._width
    q, k, v = packed_qkv(length, kv_heads * group, kv_heads, d, seed)
    scale = d**-0.5
    assert cpu_prefill.applies(q, k)
    got, want = cpu_prefill.causal(q, k, v, scale), sdpa(q, k, v, scale)
    assert got.shape == want.shape and got.is_contiguous()
    # atol 5e-5: outputs reach ~7 (inputs scaled by 2) and float32 sums over 257 keys in another order differ by
    # up to 1.6e-5 (200 seeds; one example at 1.06e-5 failed 1e-5); a key the mask lets through costs ~0.1-1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=5e-5)


def test_a_query_sees_no_later_key():
    """Changing the keys and values after position p leaves the outputs up to p as they were."""
    q, k, v = packed_qkv(40, 6, 2, cpu_prefill._width * 2, seed=1)
    before = cpu_prefill.causal(q, k, v, 0.1)
    k2, v2 = k.clone(), v.clone()
    k2[21:] += 5.0
    v2[21:] -= 3.0
    after = cpu_prefill.causal(q, k2, v2, 0.1)
    assert torch.equal(after[:21], before[:21])
    assert not torch.allclose(after[21:], before[21:])


def test_the_backend_takes_it_only_for_a_fresh_causal_chunk(monkeypatch):
    """prefill_one: a chunk from position 0 without a window goes to the kernel; a chunk after a cached
    prefix or under a sliding window keeps SDPA with a mask; the outputs match SDPA either way."""
    calls = []
    kernel = cpu_prefill.causal
    monkeypatch.setattr(cpu_prefill, "causal", lambda *a: calls.append(a[0].shape[0]) or kernel(*a))
    q, k, v = packed_qkv(24, 6, 2, cpu_prefill._width, seed=2)
    causal = CpuAttentionBackend().causal_kernel  # what the CPU backend hands the plain code
    out = torch_backend.prefill_one(q, k, v, 24, 0.25, causal=causal)
    assert torch_backend.prefill_one(q, k, v, 24, 0.25) is not None and calls == [24]  # the plain backend: SDPA
    torch.testing.assert_close(out, sdpa(q, k, v, 0.25), rtol=1e-5, atol=1e-5)
    assert calls == [24]
    with torch.enable_grad():
        assert not cpu_prefill.applies(q.requires_grad_(), k)
    torch_backend.prefill_one(q[16:], k, v, 24, 0.25, causal=causal)  # 8 queries after 16 cached positions
    torch_backend.prefill_one(q, k, v, 24, 0.25, window=8, causal=causal)
    assert calls == [24]


def test_bad_input_is_a_clear_error():
    q, k, v = packed_qkv(8, 6, 2, cpu_prefill._width, seed=3)
    with pytest.raises(RuntimeError, match="multiple of kv_heads"):
        cpu_prefill.causal(q[:, :5], k, v, 1.0)
    with pytest.raises(RuntimeError, match="float32"):
        cpu_prefill.causal(q.double(), k.double(), v.double(), 1.0)
    with pytest.raises(RuntimeError, match="head_dim"):
        cpu_prefill.causal(q[..., :4], k[..., :4], v[..., :4], 1.0)


def test_the_engine_gives_the_same_tokens_with_the_kernel_off(monkeypatch):
    """Whole prompts (and chunked ones, which keep SDPA past their first chunk) with the kernel on and off."""
    model = tiny_model(heads=6, kv_heads=2, head_dim=cpu_prefill._width)
    calls = []
    kernel = cpu_prefill.causal
    monkeypatch.setattr(cpu_prefill, "causal", lambda *a: calls.append(a[0].shape[0]) or kernel(*a))

    with_kernel = serve_growing_prompts(model)
    assert calls and max(calls) > 1
    monkeypatch.setattr(cpu_prefill, "_ready", False)
    calls.clear()
    assert serve_growing_prompts(model) == with_kernel
    assert not calls
