"""Build and load the C++ paged decode attention (minillm/cpu/kernels/paged_attention.cpp) for this CPU.

The torch attention backend calls ``paged_decode`` for decode queries on the CPU
when the KV cache is float32 or bfloat16: the kernel follows each sequence's block
table and reads K/V rows where they live, instead of gathering them into a
contiguous copy first (the plain PyTorch path, kept as the reference and the
fallback: minillm/attention/torch_backend.py). Built like the GGUF kernels (same
flags, same cache folder, ``ATEN_CPU_CAPABILITY`` selects the instruction set).

``MINILLM_CPU_ATTENTION=torch`` turns the kernel off (the gather path runs instead).
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from minillm import envs
from minillm.cpu.kernels import gguf_cpu

SOURCE = Path(__file__).with_name("paged_attention.cpp")
DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def load():
    """torch.ops.minillm_attn, or GGUFKernelUnavailable with the reason (no compiler, build error)."""
    return gguf_cpu.build_and_load(SOURCE, "minillm_attn", {"paged_decode": _paged_decode_shape,
                                                            "paged_decode_paths": _paged_decode_shape},
                                   c_functions=True)


# paged_decode as a C function (paged_attention.cpp), for compiled graphs' C++ wrappers (engine/compile.py)
C_FUNCTION = ("paged_decode", "AOTITorchError aoti_torch_cpu_paged_decode(AtenTensorHandle q, AtenTensorHandle k_cache, "
                              "AtenTensorHandle v_cache, AtenTensorHandle block_tables, AtenTensorHandle seq_lens, "
                              "double scale, int64_t window, AtenTensorHandle* ret0)")

_ready = False  # set once the kernel loaded; read by traced code, so a compiled graph never builds


@functools.cache
def available() -> bool:
    """Build/load once (call it eagerly); False where the build fails: the torch path runs, and says why once."""
    global _ready
    _ready = gguf_cpu.loads_unless_turned_off(envs.MINILLM_CPU_ATTENTION, "torch", load,
                                              "CPU paged attention unavailable, gathering K/V in PyTorch instead")
    return _ready


def applies(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """The kernel's case: it loaded (available() ran), CPU tensors, a float32/bfloat16 cache in q's dtype."""
    return _ready and q.device.type == "cpu" and k_cache.dtype == q.dtype and q.dtype in DTYPES


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float, window: int | None = None,
                 tail_slots: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, D] (one query per sequence) -> [B, H, D], reading K/V through block_tables [>= B, blocks].

    tail_slots [B, T] (int64, right-aligned, -1 = none): query b's last keys come from these pool slots
    instead of its block table -- a draft-tree node's root-to-node path (minillm/cpu/kernels/paged_attention.cpp)."""
    if tail_slots is None:
        return torch.ops.minillm_attn.paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, window or 0)
    return torch.ops.minillm_attn.paged_decode_paths(q, k_cache, v_cache, block_tables, seq_lens, scale, window or 0,
                                                     tail_slots)


def _paged_decode_shape(q, k_cache, v_cache, block_tables, seq_lens, scale, window=0, tail_slots=None):  # for torch.compile
    return torch.empty_like(q, memory_format=torch.contiguous_format)
