"""Build and load the batched float32 linear (kernels/cpu/tiled_f32.cpp) for this CPU.

A batched decode step multiplies each weight matrix by tens to a few hundred rows: bound by the FMA
units, not by reading W. MKL's sgemm reaches ~195 GFLOP/s on such a product when W is in cache,
but a decode step reads every layer's W from memory once, and then MKL loses ~15%: it packs W
into panels without looking ahead. The tiled kernel reads W in place, meets each MR-row tile with
the rows of x in RB-row register blocks, and prefetches the next tile while the first block runs.
Measured on a 2-core AMD EPYC (Zen 4, AVX-512), torch 2.13, two threads, float32, the default
model's layer shapes with 30 different weights in turn (so each comes from memory), GFLOP/s:

    layer [out, in]          rows:   64        96        128
                                  MKL  tiled  MKL  tiled  MKL  tiled
    MLP gate/up [3072, 576]      141   197   154   198   173   208
    MLP down    [576, 1536]      150   191   170   186   180   196
    attention qkv [960, 576]     147   196   161   193   173   202
    attention out [576, 576]     146   190   157   188   171   197

At 256 rows and more MKL's cache blocking catches up (down: MKL 189, tiled 175), so the engine
uses the tiled kernel from MIN_ROWS (24: below, the few-row kernel is faster) to MAX_ROWS rows
(models/skinny_linear.py), and MKL above, except on wide layers (out >= WIDE x in), where it
stays ahead at any row count (MLP gate/up at 2,048 rows: 200 GFLOP/s against MKL's 180).
Built like the GGUF kernels (same flags, same cache folder; ``ATEN_CPU_CAPABILITY=avx2`` builds
the AVX2 tiles, ``default`` the portable C++).
``MINILLM_TILED=mkl`` turns it off.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from minillm.kernels import gguf_cpu

SOURCE = Path(__file__).with_name("cpu") / "tiled_f32.cpp"
MIN_ROWS, MAX_ROWS = 24, 192  # below: the few-row kernel; above: MKL, except for wide layers (module docstring)
WIDE = 2  # out / in from which a layer keeps the tiled kernel at any row count (prefill's MLP gate/up)

_ready = False  # set once the kernel loaded; read by traced code, so a compiled graph never builds


def load():
    """torch.ops.minillm_tiled, or GGUFKernelUnavailable with the reason (no compiler, build error)."""
    return gguf_cpu.build_and_load(SOURCE, "minillm_tiled", {"linear": _linear_shape})


@functools.cache
def available() -> bool:
    """Build/load once (call it eagerly); False where the build fails or MINILLM_TILED=mkl: MKL runs instead."""
    global _ready
    _ready = gguf_cpu.loads_unless_turned_off("MINILLM_TILED", "mkl", load,
                                              "batched float32 linear unavailable, using MKL")
    return _ready


def loaded_isa() -> str | None:
    """The instruction set of the build this process loaded (avx512, avx2, portable), or None (never builds)."""
    return torch.ops.minillm_tiled.isa() if _ready else None


def applies(rows: int, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The kernel's case: it loaded, float32 CPU tensors, a contiguous [out, in] weight, and MIN_ROWS to
    MAX_ROWS rows, or any number from MIN_ROWS on for a wide layer (out >= WIDE x in: MLP gate/up, LM head)."""
    wide = weight.dim() == 2 and weight.shape[0] >= WIDE * weight.shape[1]
    return (_ready and MIN_ROWS <= rows and (rows <= MAX_ROWS or wide) and x.device.type == "cpu"
            and x.dtype == torch.float32 and weight.dtype == torch.float32 and weight.is_contiguous())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           row_major_out: bool = True) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T + bias: [M, N] row-major, or (row_major_out=False) its transpose
    [N, M] row-major, so that `.t()` is the product as a column-major [M, N] view."""
    return torch.ops.minillm_tiled.linear(x, weight, bias, row_major_out)


def _linear_shape(x, weight, bias=None, row_major_out=True):  # for torch.compile: the output's shape only
    shape = (x.shape[0], weight.shape[0]) if row_major_out else (weight.shape[0], x.shape[0])
    return x.new_empty(shape)
