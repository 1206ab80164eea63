"""Fused residual-add + RMSNorm: ``r = x + residual; y = r / rms(r) * weight``.

Algorithm
---------
Each program normalises ``BLOCK_T`` rows; a whole row (``hidden`` padded to a
power of two, masked) sits in registers, so the row is read once, its sum of
squares reduced on chip, and ``y`` (plus the new residual ``r``) written once:
one pass over the hidden state instead of three (add, norm, scale) in eager
PyTorch. Math is fp32; ``r`` is rounded to the activation dtype before it is
normalised, exactly as the unfused ``x + residual`` in that dtype would be, so
the fused and unfused model agree bit for bit up to summation order.
Masks: ``t < T`` for the ragged last row tile, ``n < N`` for the padding.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels._common import cast_out, interpreting, next_pow2


@triton.jit
def _rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, T, eps,
    N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RES: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    n = tl.arange(0, BLOCK_N)
    mask = (t < T)[:, None] & (n < N)[None, :]
    off = t.to(tl.int64)[:, None] * N + n[None, :]  # rows are contiguous (the wrapper makes them so)
    x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = cast_out(x + tl.load(res_ptr + off, mask=mask, other=0.0).to(tl.float32), x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + off, r, mask=mask)
        x = r.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, 1) / N + eps)  # padded lanes are 0: they add nothing
    w = tl.load(w_ptr + n, mask=n < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + off, cast_out(x * inv[:, None] * w[None, :], y_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [..., N] -> y, or (y, x + residual) when a residual is given (same contract as the model's RMSNorm)."""
    shape, N = x.shape, x.shape[-1]
    x2 = x.reshape(-1, N).contiguous()
    T = x2.shape[0]
    y = torch.empty_like(x2)
    res = residual.reshape(-1, N).contiguous() if residual is not None else x2
    res_out = torch.empty_like(x2) if residual is not None else y
    bn = next_pow2(N)
    bt = max(1, min(next_pow2(T), (1 << 15 if interpreting() else 1 << 12) // bn))
    if T:
        _rmsnorm_kernel[(triton.cdiv(T, bt),)](
            x2, res, weight, y, res_out, T, eps, N=N, BLOCK_T=bt, BLOCK_N=bn, HAS_RES=residual is not None,
            num_warps=4 if bn * bt <= 4096 else 8,
        )
    if residual is None:
        return y.view(shape)
    return y.view(shape), res_out.view(shape)


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch, as minillm.models.layers.RMSNorm computes it."""
    r = x if residual is None else x + residual
    rf = r.float()
    y = (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    return y if residual is None else (y, r)


def gpu_compile_specs(dtype: torch.dtype = torch.bfloat16, hidden: int = 576) -> list[tuple]:
    from minillm.kernels._common import TRITON_PTR

    p = TRITON_PTR[dtype]
    bn = next_pow2(hidden)
    sig = dict(x_ptr=p, res_ptr=p, w_ptr="*fp32", y_ptr=p, res_out_ptr=p, T="i32", eps="fp32",
               N=hidden, BLOCK_T=max(1, 4096 // bn), BLOCK_N=bn, HAS_RES=True)
    return [("rms_norm", _rmsnorm_kernel, sig, {"num_warps": 4, "num_stages": 1})]


def perf_report(tokens: int = 8192, hidden: int = 4096, dtype: torch.dtype = torch.bfloat16,
                roofs: dict | None = None, device: str = "cuda") -> dict:
    """GPU: GB/s of the fused add+norm (reads x, residual; writes y, residual) vs the copy roof."""
    import triton.testing

    x = torch.randn(tokens, hidden, dtype=dtype, device=device)
    r = torch.randn_like(x)
    w = torch.rand(hidden, device=device) + 0.5
    y, ro = rms_norm(x, w, 1e-5, r)
    yr, rr = rms_norm_ref(x, w, 1e-5, r)
    err = max((y.float() - yr.float()).abs().max().item(), (ro.float() - rr.float()).abs().max().item())
    ms = triton.testing.do_bench(lambda: rms_norm(x, w, 1e-5, r))
    gbs = 4 * x.numel() * x.element_size() / (ms * 1e-3) / 1e9
    rep = {"kernel": "rms_norm", "ok": err < 5e-2, "max_abs_err": err, "ms": ms, "GBps": gbs,
           "shape": {"T": tokens, "N": hidden, "kvh": "-", "D": "-", "dtype": str(dtype)}}
    if roofs:
        rep["frac_of_copy_bw"] = gbs / roofs["copy_GBps"]
    return rep
