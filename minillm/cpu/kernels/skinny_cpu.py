"""Build and load the few-row float32 linear (minillm/cpu/kernels/skinny_f32.cpp) for this CPU.

A decode step multiplies each weight matrix by a few rows: a verify step of k + 1 tokens, a
small batch. Reading W is the whole cost, so a few rows should cost about what one row costs.
MKL's kernels do not: measured on a 2-core AMD EPYC (AVX-512), torch 2.13, two threads, the
default model's 210 body linears (425 MB float32) per step:

    rows of x                    1      2      3      4      8      16     32
    MKL, W @ x.T (SkinnyLinear)  19.2   17.8   25.6   27.6   41.8   49.1   74.7 ms
    this kernel                  13.0   13.5   13.1   13.5   17.2   28.8   51.0 ms

(median of 9 and of 7, two runs; the LM head [49152, 576] alone: 33 GB/s at 1-4 rows, the
machine's read roof; from 8 rows on the FMA units bound it: beyond 8 rows each weight tile, read
from memory once, meets the rows of x 8 at a time from L1).

The kernel streams each weight row once and meets it with all M rows in registers (AVX2 + FMA,
a portable C++ path beside it). One to three rows read each thread's weight rows as one sequential
prefetched stream (on a 2-vCPU Zen 5: one row, the head 1.63 -> 1.14 ms, the body 8.33 -> 6.53 ms
against the 4-row tiles the table above measured); from 4 rows on, the tiles. Built like the GGUF kernels (same flags, same cache folder;
``ATEN_CPU_CAPABILITY=default`` builds the portable path). ``MINILLM_SKINNY=mkl`` turns it off.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from minillm import envs
from minillm.cpu.kernels import gguf_cpu

SOURCE = Path(__file__).with_name("skinny_f32.cpp")
MAX_ROWS = 32  # the kernel's limit (skinny_f32.cpp MAX_ROWS)

# the op as a C function (skinny_f32.cpp), for compiled graphs' C++ wrappers (engine/compile.py, direct_calls)
C_FUNCTION = ("linear", "AOTITorchError aoti_torch_cpu_linear(AtenTensorHandle x, AtenTensorHandle weight, "
                        "AtenTensorHandle* bias, int32_t portable, AtenTensorHandle* ret0)")

_ready = False  # set once the kernel loaded; read by traced code, so a compiled graph never builds


def load():
    """torch.ops.minillm_skinny, or GGUFKernelUnavailable with the reason (no compiler, build error)."""
    return gguf_cpu.build_and_load(SOURCE, "minillm_skinny", {"linear": _linear_shape, "greedy": _greedy_shape},
                                   c_functions=True)


@functools.cache
def available() -> bool:
    """Build/load once (call it eagerly); False where the build fails or MINILLM_SKINNY=mkl: MKL runs instead."""
    global _ready
    _ready = gguf_cpu.loads_unless_turned_off(envs.MINILLM_SKINNY, "mkl", load,
                                              "few-row float32 linear unavailable, using MKL")
    return _ready


def applies(rows: int, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The kernel's case: it loaded, 1-32 rows, float32 CPU tensors, a contiguous [out, in] weight."""
    return (_ready and 0 < rows <= MAX_ROWS and x.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and weight.is_contiguous())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           portable: bool = False) -> torch.Tensor:
    """x [M, K] (M <= 32) @ weight[N, K].T + bias -> [M, N]."""
    return torch.ops.minillm_skinny.linear(x, weight, bias, portable)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits [M, N] float32 -> [M] int64: each row's first maximum (a NaN counts as the maximum), each
    thread scanning the columns it wrote as the LM head's rows (skinny_f32.cpp, greedy)."""
    return torch.ops.minillm_skinny.greedy(logits)


def greedy_applies(logits: torch.Tensor) -> bool:
    """greedy's case: the kernel loaded, a 2-D float32 CPU tensor, not while Dynamo traces."""
    return (_ready and logits.dim() == 2 and logits.dtype == torch.float32 and logits.device.type == "cpu"
            and logits.shape[1] > 0 and not torch.compiler.is_compiling())


def _linear_shape(x, weight, bias=None, portable=False):  # for torch.compile: the output's shape only
    return x.new_empty((x.shape[0], weight.shape[0]))


def _greedy_shape(logits):
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)
