"""Build and load the batched float32 linear (minillm/cpu/kernels/tiled_f32.cpp) for this CPU.

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
(minillm/cpu/skinny_linear.py), and MKL above, except on wide layers (out >= WIDE x in), where it
stays ahead at any row count (MLP gate/up at 2,048 rows: 200 GFLOP/s against MKL's 180).

On Intel CPUs MKL runs its own tuned AVX-512 sgemm, and the picture turns. Measured on a 2-vCPU
Intel Xeon (AVX-512, AMX), torch 2.13, two threads, 24 weights in turn, ms per product:

    layer [out, in]          rows:  32            64            128           1,024
                                  MKL   tiled   MKL   tiled   MKL   tiled   MKL    tiled
    MLP gate/up [3072, 576]      0.95  0.65    1.28  1.08    1.93  2.05    11.4   17.5
    attention qkv [960, 576]     0.25  0.22    0.33  0.35    0.57  0.68     3.6    5.7
    attention out [576, 576]     0.12  0.14    0.19  0.22    0.34  0.45     2.2    3.5
    MLP down [576, 1536]         0.43  0.40    0.64  0.72    0.97  1.16     5.7   10.7
    LM head [49152, 576]         12.6  9.5     23.1  17.6    24.2* 26.6*     --    --   (* 96 rows)

MKL reaches 320 GFLOP/s at prefill's 1,024 rows there (the tiled kernel ~200): the Xeon's two
512-bit FMA ports, which MKL's kernel keeps busy and this one does not. So on an Intel CPU the
kernel keeps only the wide layers' 24 to 64 rows (`row_limits`), where it still wins; elsewhere MKL.
Built like the GGUF kernels (same flags, same cache folder; ``ATEN_CPU_CAPABILITY=avx2`` builds
the AVX2 tiles, ``default`` the portable C++).
On a CPU where it outruns MKL even at prefill's row counts (`outruns_mkl`: measured at start-up; a
Zen 5's full-width 512-bit FMAs, where MKL runs ~200 GFLOP/s and this kernel 360-440) it takes every
row count from MIN_ROWS.
``MINILLM_TILED=mkl`` turns it off; ``MINILLM_TILED=full`` runs it over the Zen 4's ranges on any CPU
(no start-up check); ``MINILLM_TILED=all`` at every row count from MIN_ROWS.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from minillm import envs
from minillm.cpu.kernels import gguf_cpu

SOURCE = Path(__file__).with_name("tiled_f32.cpp")
MIN_ROWS, MAX_ROWS = 24, 192  # below: the few-row kernel; above: MKL, except for wide layers (module docstring)
WIDE = 2  # out / in from which a layer keeps the tiled kernel at any row count (prefill's MLP gate/up)

_ready = False  # set once the kernel loaded; read by traced code, so a compiled graph never builds


@dataclass(frozen=True)
class RowLimits:
    """The row counts at which the kernel beats MKL on this CPU (measured: the module docstring)."""
    narrow_max: int | None  # most rows on a narrow layer (0: none; None: any count)
    wide_max: int | None  # most rows on a wide layer; None: any count
    why: str


def cpu_vendor() -> str:
    """"intel", "amd" or "other", from the CPU's vendor string (MKL tunes its kernels for Intel's)."""
    line = gguf_cpu.cpuinfo_line("vendor_id")
    vendor = line.split(":", 1)[1].strip() if line and ":" in line else ""
    return {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(vendor, "other")


def mkl_preferred() -> bool:
    """True on an Intel CPU, where MKL runs its own tuned sgemm (the module docstring's Xeon table), unless
    MINILLM_TILED=full asks for the other CPUs' ranges (for comparisons). Read by `row_limits` and by
    SkinnyLinear's choice between W @ x.T and F.linear beyond the kernels."""
    return envs.tiled() != "full" and cpu_vendor() == "intel"


OUTRUNS_BY = 1.25  # how much faster than MKL at 512 rows the kernel must measure to take every row count
CHECK_SHAPE = (512, 1536, 576)  # rows, in, out: MLP down at prefill's rows, where MKL was ahead on the Zen 4


@functools.cache
def outruns_mkl() -> bool:
    """Whether the kernel beats MKL by OUTRUNS_BY even at prefill's row counts on this CPU: measured once per
    process (~0.1 s; ``MINILLM_TILED=all`` says yes without measuring, ``full`` or ``mkl`` no).

    MKL's sgemm runs its own tuned AVX-512 code on Intel CPUs only. On AMD it reached ~200 GFLOP/s on
    the Zen 4 and on a Zen 5 alike (2 vCPUs, two threads), but a Zen 5 has full-width 512-bit FMA units
    where a Zen 4 splits each FMA in two: there the tiled kernel measured 360-440 GFLOP/s at every row
    count from 32 to 2,048 on every layer of the default model (1.8-2.6x MKL), on the Zen 4 0.93x MKL at
    256 rows of MLP down. The vendor does not tell the two apart, so the kernels are timed on one product."""
    setting = envs.tiled()
    if setting == "all":
        return True
    if setting in ("full", "mkl") or not available():
        return False
    rows, k, n = CHECK_SHAPE
    g = torch.Generator().manual_seed(0)
    x, weights = torch.randn(rows, k, generator=g), [torch.randn(n, k, generator=g) for _ in range(3)]
    best = {"mkl": float("inf"), "tiled": float("inf")}
    products = {"mkl": torch.nn.functional.linear, "tiled": linear}
    for _ in range(3):  # alternate, keep each one's fastest pass: another tenant can only slow a pass down
        for name, product in products.items():
            start = time.perf_counter()
            for w in weights:
                product(x, w)
            best[name] = min(best[name], time.perf_counter() - start)
    return best["mkl"] >= OUTRUNS_BY * best["tiled"]


@functools.cache
def row_limits() -> RowLimits:
    """Where the kernel runs: every count from MIN_ROWS where it `outruns_mkl`; with `mkl_preferred` only
    the wide layers' 24-64 rows; elsewhere MIN_ROWS to MAX_ROWS rows, and any count on a wide layer."""
    if outruns_mkl():
        return RowLimits(narrow_max=None, wide_max=None,
                         why=f"from {MIN_ROWS} rows at any count: measured {OUTRUNS_BY}x MKL or more at 512 rows")
    if mkl_preferred():
        return RowLimits(narrow_max=0, wide_max=64, why="Intel CPU: MKL's sgemm beyond the wide layers' 24-64 rows")
    return RowLimits(narrow_max=MAX_ROWS, wide_max=None, why=f"{MIN_ROWS}-{MAX_ROWS} rows, wide layers any count")


def load():
    """torch.ops.minillm_tiled, or GGUFKernelUnavailable with the reason (no compiler, build error)."""
    return gguf_cpu.build_and_load(SOURCE, "minillm_tiled", {"linear": _linear_shape})


@functools.cache
def available() -> bool:
    """Build/load once (call it eagerly); False where the build fails or MINILLM_TILED=mkl: MKL runs instead."""
    global _ready
    _ready = gguf_cpu.loads_unless_turned_off(envs.MINILLM_TILED, "mkl", load,
                                              "batched float32 linear unavailable, using MKL")
    return _ready


def loaded_isa() -> str | None:
    """The instruction set of the build this process loaded (avx512, avx2, portable), or None (never builds)."""
    return torch.ops.minillm_tiled.isa() if _ready else None


def applies(rows: int, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The kernel's case: it loaded, float32 CPU tensors, a contiguous [out, in] weight, and a row count
    from MIN_ROWS within this CPU's `row_limits` (a wide layer: out >= WIDE x in, MLP gate/up, LM head)."""
    if not _ready or rows < MIN_ROWS:
        return False
    wide = weight.dim() == 2 and weight.shape[0] >= WIDE * weight.shape[1]
    limits = row_limits()
    most = limits.wide_max if wide else limits.narrow_max
    return ((most is None or rows <= most) and x.device.type == "cpu"
            and x.dtype == torch.float32 and weight.dtype == torch.float32 and weight.is_contiguous())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           row_major_out: bool = True) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T + bias: [M, N] row-major, or (row_major_out=False) its transpose
    [N, M] row-major, so that `.t()` is the product as a column-major [M, N] view."""
    return torch.ops.minillm_tiled.linear(x, weight, bias, row_major_out)


def _linear_shape(x, weight, bias=None, row_major_out=True):  # for torch.compile: the output's shape only
    shape = (x.shape[0], weight.shape[0]) if row_major_out else (weight.shape[0], x.shape[0])
    return x.new_empty(shape)
