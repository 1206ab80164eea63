"""Batched float32 linears on a prepacked weight: MKL's packed sgemm, on Intel CPUs.

Each call of MKL's sgemm first copies the weight into the panel layout its micro-kernel reads, and in
a batched decode step every weight comes from memory once per step, so that copy is a pass over
memory the product then waits for. MKL can keep a weight packed instead (``cblas_sgemm_pack``, torch's
``torch.ops.mkl._mkl_reorder_linear_weight`` / ``_mkl_linear``, what inductor's freezing uses for
float32): the copy is made once and each step's product reads the packed panels directly.

Measured on a 2-vCPU Intel Xeon (AVX-512, AMX), torch 2.13, two threads, float32: the default
model's 120 body products (qkv, out, gate/up, down, 30 different weights of each, so each comes from
memory) and its LM head [49152, 576], one pass, median of 5 (3 at 2,048 rows), alternating:

    rows         33      64      128     256     512     2,048
    F.linear     50.7    76.9    111.5   287.7   370.8   1,442 ms
    packed       41.6    55.4    88.0    253.9   354.0   1,397 ms
                 x1.22   x1.39   x1.27   x1.13   x1.05   x1.03

So the engine packs a weight the first time a batched decode step (more than
`skinny_linear.transposed_max_rows` rows, at most MAX_ROWS: at prefill sizes the two are level) multiplies
it, and keeps the copy while the weight lives: the memory of the batched linears twice (the original stays
for the few-row kernels, compiled graphs and the state dict). A weight changed in place or replaced (its
version or storage moves) is packed again. The copies of a process stay within ``MINILLM_MKL_PACK_MB``
(default 1,024 MB: the default model's ~430 MB fit; a 1.5B model in float32 packs its first layers and
multiplies the rest unpacked), so a big float32 model does not need twice its memory: a CI worker holding
the 1.5B model and its transformers reference was killed for memory when every weight was packed.

torch calls the packed product only when the row count equals the one it was packed for and otherwise
falls back to the plain sgemm; MKL's packed B panels do not depend on the row count, so every call
passes its own count. `works_here` checks that on this MKL once per process (exact against F.linear at
several counts); where it does not hold, or off Intel, or with ``MINILLM_MKL_PACK=0``, F.linear runs.
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from minillm import envs
from minillm.cpu.kernels import tiled_cpu

PACK_ROWS = 128  # the row count the packing is asked for (any count then reads it, see the docstring)
MAX_ROWS = 256  # above, F.linear: x1.05 at 512 rows and level at 2,048 do not pay for a second copy
DEFAULT_BUDGET_MB = envs.MKL_PACK_MB_DEFAULT


@dataclass
class PackedWeight:
    packed: torch.Tensor  # MKL's opaque buffer (an MkldnnCPU tensor)
    data_ptr: int  # the weight it was packed from: storage and version, to notice a change
    version: int
    nbytes: int  # the weight's bytes: what its packed copy adds to the resident memory (measured)


_packed: dict[int, PackedWeight] = {}  # id(weight) -> its packed copy; dropped when the weight dies
_held = 0  # sum of _packed's nbytes, kept as copies come and go (a weight past the budget asks every call)


def budget_bytes() -> int:
    """The most bytes all packed copies may hold (MINILLM_MKL_PACK_MB)."""
    return int(envs.mkl_pack_mb() * 2**20)


def packed_bytes() -> int:
    """Bytes the packed copies hold now, counted as their weights' (what the resident memory grew by)."""
    return _held


def _store(key: int, entry: PackedWeight | None) -> None:
    """Put (or, with None, drop) the copy of weight `key`, keeping _held in step."""
    global _held
    old = _packed.pop(key, None)
    _held -= old.nbytes if old is not None else 0
    if entry is not None:
        _packed[key] = entry
        _held += entry.nbytes


@functools.cache
def works_here() -> bool:
    """MKL is there, torch exposes its packed sgemm, and a weight packed for PACK_ROWS rows gives F.linear's
    result at other row counts (checked once per process on a small random product)."""
    if not (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")):
        return False
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(72, 48, generator=g), torch.randn(72, generator=g)
    try:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, PACK_ROWS)
        for rows in (1, 33, 100, PACK_ROWS, 300):
            x = torch.randn(rows, 48, generator=g)
            got = torch.ops.mkl._mkl_linear(x, packed, w, b, rows)
            if not torch.allclose(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5):
                return False
    except RuntimeError:
        return False
    return True


@functools.cache
def enabled() -> bool:
    """Intel CPU (MKL's own sgemm is the one the engine uses there), not turned off, and `works_here`."""
    return envs.mkl_pack() and tiled_cpu.mkl_preferred() and works_here()


def applies(rows: int, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """A batched float32 product on the CPU up to MAX_ROWS rows (the caller sends only batches), a contiguous
    [out, in] weight."""
    return (0 < rows <= MAX_ROWS and x.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and weight.is_contiguous() and enabled())


def packed_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight's packed copy, made on first use and again after the weight changed; None when a new copy
    would pass the budget (the product then runs unpacked)."""
    key = id(weight)
    entry = _packed.get(key)
    if entry is None or entry.data_ptr != weight.data_ptr() or entry.version != weight._version:
        held = packed_bytes() - (entry.nbytes if entry is not None else 0)
        if held + weight.nbytes > budget_bytes():
            return None
        if entry is None:  # forget the copy with the weight (an id can be reused after that)
            weakref.finalize(weight, _store, key, None)
        entry = PackedWeight(torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), PACK_ROWS),
                             weight.data_ptr(), weight._version, weight.nbytes)
        _store(key, entry)
    return entry.packed


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T + bias -> [M, N], through the weight's packed copy (F.linear past the budget)."""
    packed = packed_weight(weight)
    if packed is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, x.shape[0])

