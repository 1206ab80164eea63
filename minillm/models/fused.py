"""The fused RMSNorm and RoPE kernels: Triton on CUDA (kernels/rmsnorm.py, kernels/rope.py), C++ on a CPU.

On CUDA the model's norms call the fused residual-add + RMSNorm kernel (one pass over
the hidden state instead of three) and its rotary embedding the RoPE kernel (one read
and one write of q and k). On a CPU, float32 tensors in eager inference take the same
two steps in C++ (kernels/fused_cpu.py; the engine builds them when it starts on a CPU).
Elsewhere, and with MINILLM_FUSED_KERNELS=0, the plain PyTorch layers in layers.py run:
they are the reference the kernels are tested against.
Gemma's norms (a 1 + w scale) keep the PyTorch path; the kernel computes x / rms * w.
"""
from __future__ import annotations

import torch

from minillm import envs
from minillm.kernels import fused_cpu

ENABLED = envs.fused_kernels()  # read once, at import


def use_fused(x: torch.Tensor) -> bool:
    return ENABLED and x.is_cuda


def use_fused_cpu(x: torch.Tensor) -> bool:
    """The C++ kernels (kernels/fused_cpu.py) for a float32 CPU tensor in eager inference: a compiled step
    leaves the fusing to inductor, and a forward that records a graph keeps the differentiable layers."""
    if not (ENABLED and x.device.type == "cpu" and x.dtype == torch.float32) or torch.is_grad_enabled():
        return False

    return fused_cpu.ready() and not torch.compiler.is_compiling()


def build_cpu_kernels() -> bool:
    """Build/load the C++ kernels now (once per machine; cached), so no forward waits for them."""
    if not ENABLED:
        return False

    return fused_cpu.available()


def rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None):

    return fused_cpu.rms_norm(x, weight, eps, residual)


def rope_cpu(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:

    return fused_cpu.rope(x, cos, sin)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None):
    from minillm.kernels.rmsnorm import rms_norm as kernel

    return kernel(x, weight, eps, residual)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos/sin: the step's rows [T, 1, D/2] (RotaryEmbedding.lookup). Row t uses row t."""
    from minillm.kernels.rope import apply_rope

    rows = torch.arange(x.shape[0], device=x.device)
    return apply_rope(x.contiguous(), rows, cos.squeeze(1), sin.squeeze(1))


def silu_mul_cpu(gate_up: torch.Tensor) -> torch.Tensor:

    return fused_cpu.silu_mul(gate_up)
