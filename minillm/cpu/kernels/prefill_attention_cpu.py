"""Build and load the C++ causal prefill attention (minillm/cpu/kernels/prefill_attention.cpp) for this CPU.

The torch attention backend calls ``causal`` for a float32 prompt chunk that starts at
position 0 with nothing cached (the fused-causal case of
minillm/attention/torch_backend.py's prefill), in place of
``scaled_dot_product_attention(is_causal=True)``, which stays the reference and the
path everywhere else (a cached prefix, a sliding window, a draft tree, other dtypes).
Built like the other CPU kernels; a build without AVX2 or AVX-512 leaves torch's kernel.

``MINILLM_CPU_PREFILL_ATTENTION=torch`` turns it off.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from minillm import envs
from minillm.cpu.kernels import gguf_cpu

SOURCE = Path(__file__).with_name("prefill_attention.cpp")


@functools.cache
def load():
    """torch.ops.minillm_prefill, or GGUFKernelUnavailable with the reason (no compiler, build error)."""
    ops = gguf_cpu.build_and_load(SOURCE, "minillm_prefill", {"causal": _causal_shape})
    if ops.isa() == "portable":
        raise gguf_cpu.GGUFKernelUnavailable("the causal prefill kernel needs AVX2 or AVX-512")
    return ops


_ready = False  # set once the kernel loaded; read per call, so a call never builds
_width = 8  # floats per vector of the loaded build: head_dim must be 1, 2, 4 or 8 of them


@functools.cache
def available() -> bool:
    """Build/load once (call it eagerly); False where it cannot: torch's kernel runs, and says why once."""
    global _ready, _width
    _ready = gguf_cpu.loads_unless_turned_off(envs.MINILLM_CPU_PREFILL_ATTENTION, "torch", load,
                                              "CPU prefill attention unavailable, torch's SDPA runs instead")
    if _ready:
        _width = 16 if load().isa() == "avx512" else 8
    return _ready


def applies(q: torch.Tensor, k: torch.Tensor) -> bool:
    """The kernel's case: it loaded (available() ran), float32 CPU tensors, a head_dim it takes, eager inference."""
    return (_ready and q.device.type == "cpu" and q.dtype == torch.float32 and k.dtype == torch.float32
            and q.shape[-1] % _width == 0 and q.shape[-1] // _width in (1, 2, 4, 8) and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling())


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [L, heads, D], k/v [L, kv_heads, D] -> [L, heads, D]: query i sees keys 0..i."""
    return torch.ops.minillm_prefill.causal(q, k, v, scale)


def _causal_shape(q, k, v, scale):  # for torch.compile: the output's shape only
    return torch.empty_like(q, memory_format=torch.contiguous_format)
