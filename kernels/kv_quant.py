"""Triton helpers for the quantized KV cache: per-(token, head) int8 / fp8-e4m3 codes and back.

The scheme is minillm.attention.kv_quant's (``scale = amax / qmax``, codes =
round-half-even of ``x / scale`` clamped to ``+-qmax``); these helpers are
written so a kernel stores bit-for-bit what the torch path stores:

* division is ``div_rn`` (IEEE round-to-nearest; plain ``/`` may lower to an
  approximate divide on a GPU);
* int8 rounding adds and subtracts 1.5 * 2^23 (round half to even for
  ``|y| < 2^22``), since an fp32 -> int cast truncates;
* fp8 e4m3 codes are built and read as ``uint8`` bits by hand: the
  interpreter's fp8 cast truncates instead of rounding, and sm80 has no fp8
  conversion instructions. Normal numbers round their fp32 mantissa to 3
  bits (half-to-even carry trick) and rebias the exponent (127 -> 7);
  subnormals (``|y| < 2^-6``) are ``round(|y| * 2^9)`` units of 2^-9.

Codes are scaled back by the consumers (decode/prefill fold the key scale
into the scores and the value scale into the probabilities), so dequantizing
costs one multiply per key, not per element.
"""
from __future__ import annotations

import triton
import triton.language as tl

QUANT_NONE, QUANT_INT8, QUANT_FP8 = 0, 1, 2
# the pointer type the kernels see for each mode's code pool (compile checks): fp8 travels as uint8 bits
QUANT_PTR = {QUANT_INT8: "*i8", QUANT_FP8: "*u8"}
QUANT_NAME = {QUANT_INT8: "int8", QUANT_FP8: "fp8"}


@triton.jit
def round_half_even(y):
    # 1.5 * 2^23: adding it drops the fraction (fp32 has no bits left for it), rounding half to even
    return (y + 12582912.0) - 12582912.0


@triton.jit
def f32_to_e4m3_bits(y):
    """fp32 with |y| <= 448 -> e4m3fn bit pattern (uint8), round to nearest even."""
    sign = (y.to(tl.uint32, bitcast=True) >> 24) & 0x80
    a = tl.abs(y)
    ab = a.to(tl.uint32, bitcast=True)
    # keep 3 mantissa bits with half-to-even carry; exponent bias 127 -> 7 is 120 << 3 in (exp|mant) units
    normal = ((ab + 0x7FFFF + ((ab >> 20) & 1)) >> 20) - (120 << 3)
    sub = round_half_even(a * 512.0).to(tl.uint32)  # multiples of 2^-9; 8 rounds up to the smallest normal
    code = tl.where(a >= 0.015625, normal, sub)
    return (code | sign).to(tl.uint8)


@triton.jit
def e4m3_bits_to_f32(b):
    """e4m3fn bit pattern (uint8) -> fp32 (exact)."""
    b = b.to(tl.uint32)
    em = b & 0x7F
    normal = (((em + (120 << 3)) << 20) | ((b & 0x80) << 24)).to(tl.float32, bitcast=True)
    sub = (b & 7).to(tl.float32) * 0.001953125
    sub = tl.where((b & 0x80) != 0, -sub, sub)
    return tl.where(em < 8, sub, normal)


@triton.jit
def quantize_rows(x, QUANT: tl.constexpr):
    """x [T, H, D] fp32 (padding lanes 0) -> (codes [T, H, D] int8 / uint8 bits, scales [T, H] fp32)."""
    amax = tl.max(tl.abs(x), 2)
    if QUANT == 2:
        qmax = tl.full(amax.shape, 448.0, tl.float32)
    else:
        qmax = tl.full(amax.shape, 127.0, tl.float32)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, qmax), 1.0)
    y = tl.math.div_rn(x, tl.broadcast_to(scale[:, :, None], x.shape))
    y = tl.minimum(tl.maximum(y, -qmax[:, :, None]), qmax[:, :, None])
    if QUANT == 2:
        codes = f32_to_e4m3_bits(y)
    else:
        codes = round_half_even(y).to(tl.int8)
    return codes, scale


@triton.jit
def codes_to_f32(c, QUANT: tl.constexpr):
    """Loaded int8 codes or e4m3 bits -> fp32 values (not yet scaled)."""
    if QUANT == 2:
        return e4m3_bits_to_f32(c)
    else:
        return c.to(tl.float32)
