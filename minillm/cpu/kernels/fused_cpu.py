"""Build and load the fused float32 elementwise kernels (minillm/cpu/kernels/fused_elementwise.cpp) for this CPU.

The model's RMSNorm (with the residual add before it), its rotary embedding and its
SwiGLU activation call these on a float32 CPU tensor in eager mode (models/fused.py decides), one pass each
instead of PyTorch's chain of small ops. The PyTorch layers in models/layers.py stay
the reference and the fallback. Built like the other CPU kernels (same flags, same
cache folder, ``ATEN_CPU_CAPABILITY`` selects the instruction set).

``MINILLM_FUSED_KERNELS=0`` turns these off, as it does the Triton kernels on CUDA.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from minillm.cpu.kernels import gguf_cpu

SOURCE = Path(__file__).with_name("fused_elementwise.cpp")


@functools.cache
def load():
    """torch.ops.minillm_fused, or GGUFKernelUnavailable with the reason (no compiler, build error)."""
    return gguf_cpu.build_and_load(SOURCE, "minillm_fused", {"rms_norm": _same_shape, "add_rms_norm": _two_of_shape,
                                                             "rope": _rope_shape, "silu_mul": _silu_mul_shape})


_ready = False  # set once the kernels loaded; read per call, so a call never builds


@functools.cache
def available() -> bool:
    """Build/load once (call it eagerly); False where the build fails: the PyTorch layers run, and say why once."""
    global _ready
    _ready = gguf_cpu.loads_or_warns(load, "fused CPU elementwise kernels unavailable, the PyTorch layers run instead")
    return _ready


def ready() -> bool:
    return _ready


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """x / rms(x) * weight; with a residual: (norm of residual + x, residual + x), as RMSNorm.forward returns."""
    if residual is None:
        return torch.ops.minillm_fused.rms_norm(x, weight, eps)
    return torch.ops.minillm_fused.add_rms_norm(x, residual, weight, eps)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] rotated by the step's cos/sin [T, 1, D/2] (RotaryEmbedding.lookup), a new contiguous tensor."""
    return torch.ops.minillm_fused.rope(x, cos, sin)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] -> silu(gate) * up [T, I], in gate_up's layout (row-major, or a column-major view)."""
    return torch.ops.minillm_fused.silu_mul(gate_up)


def _silu_mul_shape(gate_up):
    t, i = gate_up.shape[0], gate_up.shape[1] // 2
    column = t > 1 and gate_up.stride(0) == 1 and gate_up.stride(1) == t
    return gate_up.new_empty((i, t)).t() if column else gate_up.new_empty((t, i))


def _same_shape(x, weight, eps):  # for torch.compile: shapes only
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _two_of_shape(x, residual, weight, eps):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


def _rope_shape(x, cos, sin):
    return torch.empty_like(x, memory_format=torch.contiguous_format)
