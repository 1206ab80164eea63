"""Weight-only quantized matmul: ``y = x @ dequant(W)^T`` for int8 (W8A16) and packed int4 (W4A16).

Algorithm
---------
At batch 1 a linear layer streams its whole weight once per token, so the
weight's bytes set the time. These kernels read the weight in its stored form
(1 byte or half a byte per value, plus scales) and dequantize each tile in
registers right before ``tl.dot``: the float weight never exists in memory.

Each program computes one ``BLOCK_M x BLOCK_N`` tile of ``y`` and walks K in
steps of ``BLOCK_K``:

- W8A16: ``w = q * scale[n]`` (one scale per output row, minillm.quant.int8).
  The scale is constant along K, so it is applied once to the fp32
  accumulator after the loop instead of to every weight tile.
- W4A16: codes are nibble-packed along K (byte j of a row holds k = 2j in the
  low and k = 2j + 1 in the high nibble, minillm.quant.int4), with a
  (scale, zero) per group of ``G`` input channels and row:
  ``w = (q - 8) * scale + zero``. ``BLOCK_K`` divides ``G``, so a K tile lies
  in one group and needs one (scale, zero) per row. The packed tile
  ``[BLOCK_N, BLOCK_K / 2]`` is split into low and high nibbles and
  re-interleaved with ``tl.join`` + reshape.

x tiles stay in the activation dtype (fp16/bf16 tensor-core ``tl.dot`` with
an fp32 accumulator); under the interpreter (and for fp32) everything is
widened to fp32 right after the load, because the interpreter gets bf16 math
wrong. Masks: ``m < M`` and ``n < N`` for ragged edge tiles, ``k < K`` for
int8's last K tile; int4's K is a multiple of the group, hence of ``BLOCK_K``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels._common import TRITON_PTR, cast_out, compute_in_f32, next_pow2


@triton.jit
def _w8a16_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, F32: tl.constexpr,
):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + kk
        x = tl.load(x_ptr + m.to(tl.int64)[:, None] * K + k[None, :], mask=(m < M)[:, None] & (k < K)[None, :], other=0.0)
        q = tl.load(w_ptr + n.to(tl.int64)[:, None] * K + k[None, :], mask=(n < N)[:, None] & (k < K)[None, :], other=0)
        if F32:
            acc += tl.dot(x.to(tl.float32), tl.trans(q.to(tl.float32)))
        else:
            acc += tl.dot(x, tl.trans(q.to(x.dtype)))  # |q| <= 127: exact in fp16 and bf16
    s = tl.load(s_ptr + n, mask=n < N, other=0.0).to(tl.float32)
    out = acc * s[None, :]
    tl.store(y_ptr + m.to(tl.int64)[:, None] * N + n[None, :], cast_out(out, y_ptr.dtype.element_ty),
             mask=(m < M)[:, None] & (n < N)[None, :])


@triton.jit
def _w4a16_kernel(
    x_ptr, w_ptr, sz_ptr, y_ptr, M, N, K,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, F32: tl.constexpr,
):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    jj = tl.arange(0, BLOCK_K // 2)
    KH = K // 2  # bytes per packed row (K is a multiple of the group, hence even)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + m.to(tl.int64)[:, None] * K + (k0 + kk)[None, :], mask=(m < M)[:, None], other=0.0)
        p = tl.load(w_ptr + n.to(tl.int64)[:, None] * KH + (k0 // 2 + jj)[None, :], mask=(n < N)[:, None], other=0)
        q = tl.reshape(tl.join(p & 0xF, p >> 4), (BLOCK_N, BLOCK_K))  # k = 2j (low), 2j + 1 (high)
        g = k0 // G
        sz = sz_ptr + (g * N + n) * 2
        scale = tl.load(sz, mask=n < N, other=0.0).to(tl.float32)
        zero = tl.load(sz + 1, mask=n < N, other=0.0).to(tl.float32)
        w = (q.to(tl.float32) - 8.0) * scale[:, None] + zero[:, None]
        if F32:
            acc += tl.dot(x.to(tl.float32), tl.trans(w))
        else:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    tl.store(y_ptr + m.to(tl.int64)[:, None] * N + n[None, :], cast_out(acc, y_ptr.dtype.element_ty),
             mask=(m < M)[:, None] & (n < N)[None, :])


def _tiles(M: int) -> tuple[int, int]:
    # tl.dot needs every tile side >= 16 on a GPU; decode (M = 1..16) wastes rows, not bytes
    return max(16, min(next_pow2(M), 64)), 64


def w8a16_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] (fp16/bf16/fp32), qweight int8 [N, K], scales [N] -> y [M, N] in x's dtype."""
    M, K = x.shape
    N = qweight.shape[0]
    if qweight.dtype != torch.int8 or qweight.shape[1] != K or scales.shape != (N,):
        raise ValueError(f"w8a16: need int8 weight [N, {K}] and scales [N], got {qweight.dtype} "
                         f"{tuple(qweight.shape)} and {tuple(scales.shape)}")
    x = x.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    bm, bn = _tiles(M)
    bk = 64 if K >= 64 else 32 if K >= 32 else 16
    if M and N:
        _w8a16_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn))](
            x, qweight.contiguous(), scales.contiguous(), y, M, N, K,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, F32=compute_in_f32(x.dtype),
        )
    return y


def w4a16_matmul(x: torch.Tensor, qweight: torch.Tensor, scale_zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """x [M, K], qweight uint8 [N, K/2] (nibble layout), scale_zeros [K/G, N, 2] -> y [M, N] in x's dtype."""
    M, K = x.shape
    N = qweight.shape[0]
    if K % group_size or qweight.dtype != torch.uint8 or qweight.shape[1] != K // 2:
        raise ValueError(f"w4a16: need K={K} divisible by the group {group_size} and a uint8 weight [N, {K // 2}], "
                         f"got {qweight.dtype} {tuple(qweight.shape)}")
    if scale_zeros.shape != (K // group_size, N, 2):
        raise ValueError(f"w4a16: scale_zeros must be [{K // group_size}, {N}, 2], got {tuple(scale_zeros.shape)}")
    x = x.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    bm, bn = _tiles(M)
    bk = min(group_size, 64)  # divides the group: one (scale, zero) per row per K tile
    if M and N:
        _w4a16_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn))](
            x, qweight.contiguous(), scale_zeros.contiguous(), y, M, N, K,
            G=group_size, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, F32=compute_in_f32(x.dtype),
        )
    return y


def w8a16_matmul_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch: dequantize, then matmul in fp32."""
    return (x.float() @ (qweight.float() * scales.float()[:, None]).t()).to(x.dtype)


def w4a16_matmul_ref(x: torch.Tensor, qweight: torch.Tensor, scale_zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    from minillm.quant.int4 import dequantize_int4

    w = dequantize_int4(qweight, scale_zeros, group_size, x.shape[1])
    return (x.float() @ w.t()).to(x.dtype)


def gpu_compile_specs(dtype: torch.dtype = torch.bfloat16, group_size: int = 32) -> list[tuple]:
    """(name, kernel, signature, options) at the decode shape (M <= 16) of the default model."""
    p = TRITON_PTR[dtype]
    f32 = dtype == torch.float32
    common = dict(x_ptr=p, y_ptr=p, M="i32", N="i32", K="i32", BLOCK_M=16, BLOCK_N=64, F32=f32)
    return [
        ("w8a16_matmul", _w8a16_kernel, dict(common, w_ptr="*i8", s_ptr="*fp32", BLOCK_K=64), {"num_warps": 4}),
        (f"w4a16_matmul[g{group_size}]", _w4a16_kernel,
         dict(common, w_ptr="*u8", sz_ptr="*fp32", G=group_size, BLOCK_K=min(group_size, 64)), {"num_warps": 4}),
    ]
