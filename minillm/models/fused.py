"""The fused RMSNorm and RoPE kernels on CUDA: Triton (kernels/rmsnorm.py, kernels/rope.py).

On CUDA the model's norms call the fused residual-add + RMSNorm kernel (one pass over
the hidden state instead of three) and its rotary embedding the RoPE kernel (one read
and one write of q and k): the Triton lesson's kernels, run where the course reads them.
Elsewhere, and with MINILLM_FUSED_KERNELS=0, the plain PyTorch layers in layers.py run:
they are the reference the kernels are tested against. (A CPU's C++ versions are part of
the CPU fast path: minillm/cpu/layers.py.)
Gemma's norms (a 1 + w scale) keep the PyTorch path; the kernel computes x / rms * w.
"""
from __future__ import annotations

import torch

from minillm import envs

ENABLED = envs.fused_kernels()  # read once, at import


def use_fused(x: torch.Tensor) -> bool:
    return ENABLED and x.is_cuda


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None):
    from minillm.kernels.rmsnorm import rms_norm as kernel

    return kernel(x, weight, eps, residual)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos/sin: the step's rows [T, 1, D/2] (RotaryEmbedding.lookup). Row t uses row t."""
    from minillm.kernels.rope import apply_rope

    rows = torch.arange(x.shape[0], device=x.device)
    return apply_rope(x.contiguous(), rows, cos.squeeze(1), sin.squeeze(1))
