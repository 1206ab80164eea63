"""int8 weights, one symmetric scale per output channel (row).

    w[n, k] ~= q[n, k] * scale[n],   q in [-127, 127]

Symmetric (no zero point) because weight rows are centred near zero and a
zero point would cost an extra add in the matmul; -128 is left unused so the
range is symmetric and rounding never overflows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Int8Weight:
    qweight: torch.Tensor  # int8 [N, K]
    scales: torch.Tensor  # float32 [N]

    def dequantize(self) -> torch.Tensor:
        return dequantize_int8(self.qweight, self.scales)


def quantize_int8(w: torch.Tensor) -> Int8Weight:
    """Round-to-nearest per output channel. w: [N, K] float."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"int8 quantization needs a 2-D float weight, got {tuple(w.shape)} {w.dtype}")
    w = w.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # an all-zero row keeps scale > 0
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(q, scales)


def dequantize_int8(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return qweight.float() * scales.float()[:, None]
