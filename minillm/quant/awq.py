"""Activation-aware int4 (AWQ-style): protect the input channels that see large activations.

For a linear y = x W^T, any per-input-channel s > 0 gives the same product
(x / s)(W * s)^T. Quantizing W * s instead of W gives the channels with large
s (large activations) proportionally finer steps. Following AWQ (Lin et al.
2023) s = mean|x|^alpha, and alpha in [0, 1] is searched per layer to
minimise the output error || x W^T - (x / s) Q(W * s)^T ||^2 on calibration
activations. alpha = 0 is plain round-to-nearest, so on the calibration set
AWQ never does worse than RTN.

1/s is folded into the op that produces x when it is per-channel linear:
the RMSNorm weight before qkv_proj and gate_up_proj, the `up` rows of
gate_up_proj before down_proj. o_proj's input (attention output) keeps 1/s as
a runtime multiply (QuantLinear.input_scale). Inputs are captured once from
the float model (the original AWQ re-captures after quantizing each block;
this keeps the search a single pass). The weight-clipping search of AWQ is
not done.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch



def fake_quant_int4(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """quantize_int4(w, g).dequantize() without packing the codes (the search runs it grid x layers times)."""
    n, k = w.shape
    wg = w.reshape(n, k // group_size, group_size)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15.0).clamp(min=1e-12)
    return (torch.round((wg - lo) / scale).clamp(0, 15) * scale + lo).reshape(n, k)


@dataclass
class AwqResult:
    scale: torch.Tensor  # [K] per-input-channel scale s (multiply W, divide x)
    alpha: float
    error: float  # mean squared output error with s
    rtn_error: float  # the same with s = 1 (alpha = 0)


@torch.no_grad()
def search_scale(w: torch.Tensor, x: torch.Tensor, group_size: int, grid: int = 11) -> AwqResult:
    """w [N, K] float weight, x [T, K] calibration inputs -> the best s = mean|x|^alpha."""
    w, x = w.float().contiguous(), x.float().contiguous()
    ref = x @ w.t()
    x_mean = x.abs().mean(0).clamp(min=1e-5)
    best: AwqResult | None = None
    rtn = None
    for i in range(grid):
        alpha = i / (grid - 1)
        s = x_mean.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()  # centre s around 1 so W * s stays in a sane range
        wq = fake_quant_int4(w * s, group_size) / s
        err = (x @ wq.t() - ref).pow(2).mean().item()
        if i == 0:
            rtn = err
        if best is None or err < best.error:
            best = AwqResult(s, alpha, err, 0.0)
    assert best is not None and rtn is not None
    best.rtn_error = rtn
    return best
