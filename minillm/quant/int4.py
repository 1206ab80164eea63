"""int4 weights in groups along the input dimension, with a scale and a zero per group.

    w[n, k] ~= (q[n, k] - 8) * scale[g, n] + zero[g, n],   g = k // group_size,  q in 0..15

This is the convention of torch's CPU int4 matmul (and of GGUF's Q4_0/Q4_1
after a shift of the zero by 8*scale), so one format serves round-to-nearest,
AWQ and weights kept from a GGUF file. Round-to-nearest uses each group's
min and max (asymmetric): weights in a group are rarely centred on zero.

Packed storage: two codes per byte along K, the even k in the low nibble
("nibble" layout, [N, ceil(K/2)] uint8). An odd K is padded with one zero code.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_GROUP_SIZES = (32, 64, 128, 256)


@dataclass
class Int4Weight:
    qweight: torch.Tensor  # uint8 [N, ceil(K/2)], nibble layout
    scale_zeros: torch.Tensor  # float32 [K/group, N, 2]: (scale, zero) per group and row
    group_size: int
    in_features: int

    def dequantize(self) -> torch.Tensor:
        return dequantize_int4(self.qweight, self.scale_zeros, self.group_size, self.in_features)


def check_group_size(in_features: int, group_size: int, name: str = "weight") -> None:
    if group_size not in SUPPORTED_GROUP_SIZES:
        raise ValueError(f"int4 group size must be one of {SUPPORTED_GROUP_SIZES}, got {group_size}")
    if in_features % group_size:
        raise ValueError(
            f"{name}: int4 group size {group_size} does not divide in_features={in_features}; "
            f"choose a group size that divides it (e.g. one of "
            f"{[g for g in SUPPORTED_GROUP_SIZES if in_features % g == 0] or 'none'})"
        )


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """codes [N, K] (0..15, any int dtype) -> uint8 [N, ceil(K/2)], even k in the low nibble."""
    if q.dim() != 2:
        raise ValueError(f"pack_int4 needs a 2-D tensor, got {tuple(q.shape)}")
    q = q.to(torch.uint8)
    if q.shape[1] % 2:
        q = torch.nn.functional.pad(q, (0, 1))
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """uint8 [N, ceil(K/2)] -> codes uint8 [N, K]."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(packed.shape[0], -1)[:, :in_features]


def quantize_int4(w: torch.Tensor, group_size: int) -> Int4Weight:
    """Round-to-nearest with each group's min/max. w: [N, K] float."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"int4 quantization needs a 2-D float weight, got {tuple(w.shape)} {w.dtype}")
    n, k = w.shape
    check_group_size(k, group_size)
    wg = w.float().reshape(n, k // group_size, group_size)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = ((hi - lo) / 15.0).clamp(min=1e-12)
    q = torch.round((wg - lo[..., None]) / scale[..., None]).clamp(0, 15)
    zero = lo + 8.0 * scale  # value of code 8: w = (q - 8) * scale + zero
    sz = torch.stack((scale.t(), zero.t()), dim=-1).contiguous()  # [K/g, N, 2]
    return Int4Weight(pack_int4(q.reshape(n, k)), sz, group_size, k)


def dequantize_int4(qweight: torch.Tensor, scale_zeros: torch.Tensor, group_size: int, in_features: int) -> torch.Tensor:
    q = unpack_int4(qweight, in_features).float()
    n = q.shape[0]
    sz = scale_zeros.float()
    scale = sz[..., 0].t().repeat_interleave(group_size, dim=1)  # [N, K]
    zero = sz[..., 1].t().repeat_interleave(group_size, dim=1)
    return ((q - 8.0) * scale + zero).reshape(n, in_features)
