"""Linear layers for the few-row products of CPU decode, verification and small batches (float32).

oneDNN/MKL run `x @ W.T` for a handful of rows of x far below memory speed
when W is stored [out, in] (nn.Linear's layout) or transposed. Computing the
same product as `W @ x.T` (a tall matrix times a thin one) streams W once.
Measured on a 2-core EPYC (AVX-512), SmolLM2's LM head [49152, 576], float32:

    rows of x          1      2      4      8
    x @ W.T (K-major)  7.6   14.7   28.7   31.3 ms   <- what the engine used to do
    W @ x.T            3.6*   4.4    7.3   15.9 ms   (* one row padded to two: MKL's two-column
                                                       kernel beats its matrix-vector one)

Between 9 and 15 rows MKL's narrow kernels are slower than its 16-column one
(same machine, median of 25: LM head 10 rows 17.5 ms, 12 rows 20.1 ms, 16 rows
17.5 ms; the [1536, 576] MLP projection 0.29 / 0.30 / 0.20 ms), so those are
padded to 16 rows. That is the size of a Medusa tree's verify step.

Up to 32 rows, a hand-written kernel (minillm/cpu/kernels/skinny_f32.cpp) streams each
weight row once and meets it with the rows of x in registers (8 at a time), so 1
to 4 rows cost about what reading W costs: the default model's body linears, same
machine, two threads, 1 / 2 / 4 / 8 rows: 13.0 / 13.5 / 13.5 / 17.2 ms (W @ x.T
through MKL: 19.2 / 17.8 / 27.6 / 41.8 ms); 16 / 32 rows: 28.8 / 51.0 ms (MKL
49.1 / 74.7). Where it cannot be built, MKL runs as above.

Above the kernel's 32 rows, the product `W @ x.T` comes out [out, rows], and turning it
into nn.Linear's [rows, out] is a copy that cost as much as the product saved: at 128 rows
(a batched decode step) 0.3 ms of a 2.6 ms MLP projection, 19 ms of the LM head's 61. A layer
whose every reader is elementwise (the MLP's two, the attention's output projection: an
activation or the residual add comes next) sets `column_major_out` and gets the transposed
view as is: same values, shape [rows, out], strides (1, rows). An elementwise op on it writes
the same layout, so the MLP's down projection reads its input as a contiguous `x.T`, and the
residual add (`residual + x`, residual first) writes the residual stream row-major again.
Same machine, MLP gate/up [3072, 576] at 128 rows: 2.6 ms with the copy, 2.3 without.
A wide layer read row-major (the LM head) is multiplied OUT_BLOCK output rows at a time, each
block's transpose copied while it is still in cache: SmolLM2's head at 33 / 64 / 128 / 256 rows
23 / 30 / 50 / 113 ms, against 30 / 38 / 60 / 142 ms for one product and one copy.

From 24 to 192 rows (and at any row count for a wide layer, out >= 2 x in: the MLP's gate/up in a
prefill step, the LM head) a register-tiled kernel (minillm/cpu/kernels/tiled_f32.cpp, minillm/cpu/kernels/tiled_cpu.py)
runs instead of MKL: it reads W in place and prefetches the next tile, where MKL, whose W streams
from memory in a decode step, packs it without looking ahead and loses ~15%. It writes either
layout directly, so neither the transposed view nor the blocks above are needed where it runs;
they remain the path where it cannot be built (MINILLM_TILED=mkl). Neither kernel has an autograd
formula, so a forward that records a graph takes F.linear.

On an Intel CPU MKL runs its own tuned sgemm, and both the tiled kernel's range and the W @ x.T
path above 32 rows lose to plain F.linear there (minillm/cpu/kernels/tiled_cpu.py's Xeon table,
`transposed_max_rows`): such a CPU keeps the tiled kernel for the wide layers' 24-64 rows only
and from 33 rows on everything else takes MKL's sgemm on a weight it packed once
(minillm/cpu/kernels/mkl_packed.py; F.linear where that is off).

Values are the same products (each output a dot product over `in`), only the
kernel differs (and so the order of the float sums). Used in eager mode, for the
LM head of a compiled engine (it runs outside the compiled step), and inside a
compiled decode step of up to 16 rows (GRAPH_MAX_ROWS) where the layers stay row-major (the
default where the tiled kernel out-runs MKL at prefill's row counts, else K-major
for inductor's own code; minillm/cpu/__init__.compiled_body_layout says why).
Other dtypes and devices use F.linear.
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn import functional as F

from minillm.cpu.kernels import mkl_packed, panel_cpu, skinny_cpu, tiled_cpu

MAX_ROWS = 512  # measured faster up to 256 rows on every layer shape of the default model
PANEL_ROWS = range(4, 9)  # rows that read a layer's panels where it has them (minillm/cpu/panels.py: 1-3 measured level)
OUT_BLOCK = 4096  # output rows per product of a wide layer (the module docstring's measurement)
# Most rows a compiled graph gives the few-row kernel; beyond, inductor's GEMM (frozen weights, packed its
# own way). Decode steps of row-major compiled engines on a 2-vCPU Zen 5, ms against K-major (inductor
# throughout), alternated in one process: 8 rows 16.5 / 20.4, 12 rows 22.1 / 23.1, 16 rows 27.3 / 27.8,
# but 24 rows 41.1 / 31.5 and 32 rows 50.5 / 38.6; handed to inductor, 24 and 32 rows ran 32.6 / 33.8
# and 37.2 / 38.5.
GRAPH_MAX_ROWS = 16


@functools.cache
def transposed_max_rows() -> int:
    """Rows up to which `W @ x.T` runs where neither kernel does: MAX_ROWS, but on an Intel CPU only the
    few-row kernel's 32, since MKL's own sgemm (F.linear) is faster above. Same Xeon as in
    minillm/cpu/kernels/tiled_cpu.py, ms: qkv [960, 576] at 48 / 64 rows 0.36 / 0.45 as W @ x.T, 0.31 / 0.33 through
    F.linear; the LM head at 96 rows 31.9 against 24.2."""
    return skinny_cpu.MAX_ROWS if tiled_cpu.mkl_preferred() else MAX_ROWS


def padded_rows(rows: int) -> int:
    """The row count MKL's fastest kernel for `rows` wants (measured, see the module docstring)."""
    if rows == 1:
        return 2
    if 9 <= rows <= 15:
        return 16
    return rows


class SkinnyLinear(nn.Linear):
    """nn.Linear whose CPU float32 forward for up to MAX_ROWS rows is W @ x.T."""

    # set by a layer whose readers are all elementwise: beyond the few-row kernel, return W @ x.T's
    # transpose as a view (strides (1, rows)) instead of copying it row-major (module docstring)
    column_major_out: bool = False
    # set by a layer whose output the residual add reads (attention's o_proj, the MLP's down): the tiled
    # kernel writes it row-major, the layout the residual stream keeps. Adding a column-major [2048, 576]
    # product to it took 1.1-1.3 ms against 0.08 row-major, and writing row-major costs the kernel about
    # nothing (2-vCPU Zen 5, 2,048 rows, product plus add: o_proj 4.85 -> 3.64 ms, down 11.1 -> 10.6 ms)
    read_by_residual_add: bool = False
    # the weight again in panels of 32 outputs (minillm/cpu/kernels/panel_cpu.py), for PANEL_ROWS rows; packed by
    # minillm/cpu/panels.py where an engine's steps multiply a few rows (speculative verify)
    panels: torch.Tensor | None = None
    _panel_key: tuple[int, int] | None = None  # the weight's (address, version) the panels were packed from

    def set_panels(self, panels: torch.Tensor) -> None:
        self.panels = panels
        self._panel_key = (self.weight.data_ptr(), self.weight._version)

    def panels_current(self) -> bool:
        """Whether the panels hold the weight as it is now; stale ones (the weight replaced or written
        since) are dropped."""
        if self.panels is None:
            return False
        if self._panel_key != (self.weight.data_ptr(), self.weight._version):
            self.panels, self._panel_key = None, None
            return False
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        if (self.panels is not None and rows in PANEL_ROWS and x.dtype == torch.float32 and self.panels_current()
                and not torch.is_grad_enabled() and not torch.compiler.is_compiling()):
            y = panel_cpu.linear(x.reshape(rows, x.shape[-1]), self.panels, self.bias, self.out_features)
            return y.reshape(*x.shape[:-1], self.out_features)
        # the kernels have no autograd formula: a forward that records a graph (training heads through
        # the frozen LM head) takes F.linear, whose gradient is exact
        records = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if (rows == 0 or records or x.device.type != "cpu" or x.dtype != torch.float32
                or self.weight.dtype != torch.float32 or not self.weight.is_contiguous()):  # K-major: slow here
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(rows, x.shape[-1])
        if torch.compiler.is_compiling():
            return self._traced_forward(x, x2, rows)
        if tiled_cpu.applies(rows, x2, self.weight):  # the product comes out in the layout its readers want
            column = self.column_major_out and not self.read_by_residual_add
            y = tiled_cpu.linear(x2, self.weight, self.bias, row_major_out=not column)
            return (y.t() if column else y).reshape(*x.shape[:-1], self.out_features)
        if skinny_cpu.applies(rows, x2, self.weight):
            return skinny_cpu.linear(x2, self.weight, self.bias).reshape(*x.shape[:-1], self.out_features)
        if rows > transposed_max_rows():
            if mkl_packed.applies(rows, x2, self.weight):  # Intel: MKL's sgemm on a weight packed once
                return mkl_packed.linear(x2, self.weight, self.bias).reshape(*x.shape[:-1], self.out_features)
            return F.linear(x, self.weight, self.bias)
        padded = padded_rows(rows)
        if padded != rows:
            x2 = torch.cat([x2, x2.new_zeros(padded - rows, x2.shape[1])])
        if self.column_major_out and padded == rows:
            y = (self.weight @ x2.t()).t()
        elif self.out_features > OUT_BLOCK and padded == rows:
            y = blocked_product(x2, self.weight)
        else:
            y = (self.weight @ x2.t()).t()[:rows].contiguous()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def _traced_forward(self, x: torch.Tensor, x2: torch.Tensor, rows: int | torch.SymInt) -> torch.Tensor:
        """Inside a compiled decode step: the few-row kernel as a custom op where the graph's row count is
        a constant of at most GRAPH_MAX_ROWS (a decode graph is specialised per batch size), else F.linear
        for inductor to plan (a symbolic count would make the kernel's row limit a guard of the graph). What this wins and loses
        against K-major weights: minillm/cpu/__init__.compiled_body_layout. The tiled kernel stays out:
        at 48 rows its graphs ran 12% slower (2-vCPU Xeon, two engines interleaved in one process)."""
        if isinstance(rows, int) and rows <= GRAPH_MAX_ROWS and skinny_cpu.applies(rows, x2, self.weight):
            return skinny_cpu.linear(x2, self.weight, self.bias).reshape(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)


def blocked_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T, row-major, as OUT_BLOCK-row products W_b @ x.T, each transposed into place while
    it is in cache (the same dot products as one W @ x.T)."""
    rows, out_features = x.shape[0], weight.shape[0]
    out = x.new_empty(rows, out_features)
    block = x.new_empty(OUT_BLOCK, rows)
    xt = x.t()
    for start in range(0, out_features, OUT_BLOCK):
        n = min(OUT_BLOCK, out_features - start)
        torch.mm(weight[start : start + n], xt, out=block[:n])
        out[:, start : start + n].copy_(block[:n].t())
    return out


def use_skinny_linears(model: nn.Module) -> int:
    """Turn every plain nn.Linear of `model` into a SkinnyLinear (same parameters); returns how many.
    Builds the few-row kernel now (once per machine, ~10 s; cached), so no forward waits for it."""
    skinny_cpu.available()
    tiled_cpu.available()
    n = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = SkinnyLinear  # same state, a different forward
            n += 1
    return n
