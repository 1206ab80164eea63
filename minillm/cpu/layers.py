"""The model's elementwise steps in C++ on a float32 CPU: residual add + RMSNorm, RoPE, SiLU x up.

Each runs as one pass over its tensor (minillm/cpu/kernels/fused_elementwise.cpp) where the
plain layer (models/layers.py) makes several: at batch 1 a step's ~100 small ops cost about as
much as its products. `swap_layers` gives each module a subclass that calls the kernel and
falls back to the plain layer's own code wherever the kernel does not apply: another dtype, a
forward that records a graph (the kernels have no autograd formula), a step being compiled
(inductor fuses these itself), Gemma's norms (they scale by 1 + w).
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from minillm.cpu.kernels import fused_cpu
from minillm.models.layers import RMSNorm, RotaryEmbedding, SwiGLU
from minillm.models.llama import Attention


def applies(x: torch.Tensor) -> bool:
    """A float32 CPU tensor in eager inference, with the kernels built."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled()
            and fused_cpu.ready() and not torch.compiler.is_compiling())


class CpuRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if not self.unit_offset and applies(x):
            return fused_cpu.rms_norm(x, self.weight, self.eps, residual)
        return super().forward(x, residual)


class CpuSwiGLU(SwiGLU):
    def gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        if gate_up.dim() == 2 and applies(gate_up):
            return fused_cpu.silu_mul(gate_up)
        return super().gated(gate_up)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if x.dim() == 3 and applies(x):  # [tokens, heads, D]
        return fused_cpu.rope(x, cos, sin)
    return RotaryEmbedding.apply(x, cos, sin)


@functools.cache
def with_cpu_rope(cls: type[Attention]) -> type[Attention]:
    """cls with RoPE in C++ (any attention class of the model family: the rotation is the same)."""
    return type(f"Cpu{cls.__name__}", (cls,), {"rotate": staticmethod(rotate), "__module__": __name__})


def swap_layers(model: nn.Module) -> int:
    """Give the model's norms, SwiGLU MLPs and attention layers their C++ subclasses (weights and
    state stay as they are); returns how many modules changed class. Other classes keep theirs."""
    swapped = 0
    for module in model.modules():
        cls = type(module)
        new = {RMSNorm: CpuRMSNorm, SwiGLU: CpuSwiGLU}.get(cls)
        if new is None and isinstance(module, Attention) and cls.rotate is RotaryEmbedding.apply:
            new = with_cpu_rope(cls)
        if new is not None:
            module.__class__ = new
            swapped += 1
    return swapped
