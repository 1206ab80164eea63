"""Fused RMSNorm(+residual) and RoPE kernels vs their plain-PyTorch references.

Tolerances (max |out - ref| <= atol + rtol * |ref|): fp32 1e-5; fp16 1e-3 and
bf16 8e-3, i.e. about one ulp of the output dtype (both sides compute in fp32
and round once; only summation order / FMA contraction differs). The residual
sum is rounded exactly as ``x + residual`` in the dtype, so it must match bit for bit.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from minillm.kernels.rmsnorm import rms_norm, rms_norm_ref  # noqa: E402
from minillm.kernels.rope import apply_rope, apply_rope_ref  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (8e-3, 8e-3)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, with_residual):
    g = torch.Generator().manual_seed(0)
    T, N = 37, 576  # the default model's hidden size: padded to 1024 lanes
    x = (torch.randn(T, N, generator=g) * 3).to(dtype).to(DEV)
    r = torch.randn(T, N, generator=g).to(dtype).to(DEV)
    w = (torch.rand(N, generator=g) + 0.5).to(DEV)
    atol, rtol = TOL[dtype]
    if with_residual:
        y, ro = rms_norm(x, w, 1e-5, r)
        yr, rr = rms_norm_ref(x, w, 1e-5, r)
        assert torch.equal(ro, rr)
    else:
        y, yr = rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5)
    assert y.dtype == dtype and not torch.isnan(y).any()
    torch.testing.assert_close(y.float(), yr.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,head_dim", [(9, 64), (3, 32), (4, 40)])
def test_rope(dtype, heads, head_dim):
    g = torch.Generator().manual_seed(1)
    T, max_pos = 29, 300
    # q as a strided view of a fused qkv output, written into a NaN-poisoned output
    qkv = torch.randn(T, heads + 2, head_dim, generator=g).to(dtype).to(DEV)
    x = qkv[:, :heads]
    pos = torch.randint(0, max_pos, (T,), generator=g).to(DEV)
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
    cos, sin = ang.cos().float().to(DEV), ang.sin().float().to(DEV)
    out = torch.full_like(x, float("nan"))
    apply_rope(x, pos, cos, sin, out=out)
    ref = apply_rope_ref(x, pos, cos, sin)
    atol, rtol = TOL[dtype]
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)
    # in place on the strided view leaves the rest of the fused tensor alone
    kv_before = qkv[:, heads:].clone()
    apply_rope(x, pos, cos, sin, out=x)
    torch.testing.assert_close(x.float(), ref.float(), atol=atol, rtol=rtol)
    assert torch.equal(qkv[:, heads:], kv_before)
