"""Rotary position embedding (rotate-half, the Hugging Face convention) for packed tokens.

Algorithm
---------
For each token at position ``p`` and each pair ``i < D/2`` the halves
``(x1, x2) = (x[i], x[i + D/2])`` are rotated by the angle ``p * inv_freq[i]``::

    out[i]       = x1 * cos - x2 * sin
    out[i + D/2] = x2 * cos + x1 * sin

``cos``/``sin`` come from the model's precomputed ``[max_pos, D/2]`` tables.
Each program handles ``BLOCK_T`` tokens and all their heads: the tile's lanes
are the flattened ``(head, i)`` pairs (padded to powers of two, masked), the
token's cos/sin row is gathered once per lane and reused for both halves, so
every element of x is read and written exactly once. Math in fp32, one
round-to-nearest-even back to x's dtype. Works in place (``out=x``) because
each lane reads its two inputs before writing its two outputs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels._common import cast_out, interpreting, next_pow2


@triton.jit
def _rope_kernel(
    x_ptr, pos_ptr, cos_ptr, sin_ptr, o_ptr, T,
    s_xt, s_xh, s_ot, s_oh, s_cp,
    H: tl.constexpr, HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_I: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    j = tl.arange(0, BLOCK_H * BLOCK_I)
    h = j // BLOCK_I
    i = j % BLOCK_I
    t_ok = t < T
    mask = t_ok[:, None] & ((h < H) & (i < HALF))[None, :]
    pos = tl.load(pos_ptr + t, mask=t_ok, other=0).to(tl.int64)
    cs_off = pos[:, None] * s_cp + i[None, :]
    c = tl.load(cos_ptr + cs_off, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + cs_off, mask=mask, other=0.0).to(tl.float32)
    t64 = t.to(tl.int64)
    xo = t64[:, None] * s_xt + (h * s_xh + i)[None, :]
    x1 = tl.load(x_ptr + xo, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + xo + HALF, mask=mask, other=0.0).to(tl.float32)
    oo = t64[:, None] * s_ot + (h * s_oh + i)[None, :]
    dt = o_ptr.dtype.element_ty
    tl.store(o_ptr + oo, cast_out(x1 * c - x2 * s, dt), mask=mask)
    tl.store(o_ptr + oo + HALF, cast_out(x2 * c + x1 * s, dt), mask=mask)


def apply_rope(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x [T, H, D] (last dim contiguous), positions [T], cos/sin [max_pos, D/2] -> rotated [T, H, D]."""
    T, H, D = x.shape
    assert D % 2 == 0 and x.stride(2) == 1 and cos.stride(1) == 1 and sin.stride() == cos.stride()
    if out is None:
        out = torch.empty_like(x)
    if T == 0:
        return out
    bh, bi = next_pow2(H), next_pow2(D // 2)
    bt = max(1, min(next_pow2(T), (1 << 14 if interpreting() else 1 << 11) // (bh * bi)))
    _rope_kernel[(triton.cdiv(T, bt),)](
        x, positions, cos, sin, out, T, x.stride(0), x.stride(1), out.stride(0), out.stride(1), cos.stride(0),
        H=H, HALF=D // 2, BLOCK_T=bt, BLOCK_H=bh, BLOCK_I=bi,
    )
    return out


def apply_rope_ref(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Plain PyTorch, as minillm.models.layers.RotaryEmbedding computes it."""
    c = cos[positions].unsqueeze(1)
    s = sin[positions].unsqueeze(1)
    x1, x2 = x.float().chunk(2, dim=-1)
    r = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)
    if out is not None:
        out.copy_(r)
        return out
    return r


def gpu_compile_specs(dtype: torch.dtype = torch.bfloat16, heads: int = 9, head_dim: int = 64) -> list[tuple]:
    from minillm.kernels._common import TRITON_PTR

    p = TRITON_PTR[dtype]
    bh, bi = next_pow2(heads), next_pow2(head_dim // 2)
    sig = dict(x_ptr=p, pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32", o_ptr=p, T="i32",
               s_xt="i32", s_xh="i32:16", s_ot="i32", s_oh="i32:16", s_cp="i32:16",
               H=heads, HALF=head_dim // 2, BLOCK_T=max(1, 2048 // (bh * bi)), BLOCK_H=bh, BLOCK_I=bi)
    return [("rope", _rope_kernel, sig, {"num_warps": 4, "num_stages": 1})]


def perf_report(tokens: int = 8192, heads: int = 32, head_dim: int = 128, dtype: torch.dtype = torch.bfloat16,
                roofs: dict | None = None, device: str = "cuda") -> dict:
    """GPU: GB/s of RoPE on [tokens, heads, head_dim] vs the copy roof."""
    import triton.testing

    x = torch.randn(tokens, heads, head_dim, dtype=dtype, device=device)
    pos = torch.randint(0, 8192, (tokens,), device=device)
    ang = torch.rand(8192, head_dim // 2, device=device) * 6.3
    cos, sin = ang.cos(), ang.sin()
    err = (apply_rope(x, pos, cos, sin).float() - apply_rope_ref(x, pos, cos, sin).float()).abs().max().item()
    ms = triton.testing.do_bench(lambda: apply_rope(x, pos, cos, sin))
    gbs = 2 * x.numel() * x.element_size() / (ms * 1e-3) / 1e9
    rep = {"kernel": "rope", "ok": err < 5e-2, "max_abs_err": err, "ms": ms, "GBps": gbs,
           "shape": {"T": tokens, "H": heads, "kvh": "-", "D": head_dim, "dtype": str(dtype)}}
    if roofs:
        rep["frac_of_copy_bw"] = gbs / roofs["copy_GBps"]
    return rep
