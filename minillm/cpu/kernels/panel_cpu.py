"""Build and load the panel-packed few-row float32 linear (minillm/cpu/kernels/panel_f32.cpp) for this CPU.

The few-row kernel (skinny_cpu.py) reads nn.Linear's row-major weights; at 4 rows (a draft tree's
verify step) each weight row becomes 4 dot products with horizontal sums, and the step costs ~1.2
one-row steps. Packed in panels of 32 outputs ([ceil(N/32), K, 32]), the same product broadcasts
x and keeps 32 outputs per pair of registers, one stream per thread: 4 rows cost about what 1 does
(figures in the source's header). The panels are a second copy of each weight; the engine packs them
where few-row steps are the point (models/skinny_linear.use_panels). Built like the other CPU kernels
(same flags, same cache folder); the fast path is AVX-512 only (`simd()`).
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from minillm import envs
from minillm.cpu.kernels import gguf_cpu

SOURCE = Path(__file__).with_name("panel_f32.cpp")
PANEL = 32  # outputs per panel (panel_f32.cpp PANEL)
MAX_ROWS = 16  # the kernel's limit (panel_f32.cpp MAX_ROWS)


def load():
    """torch.ops.minillm_panel, or GGUFKernelUnavailable with the reason (no compiler, build error)."""
    return gguf_cpu.build_and_load(SOURCE, "minillm_panel", {"linear": _linear_shape})


@functools.cache
def available() -> bool:
    """Whether the kernel loads with its AVX-512 path: only then is packing a model's panels worth it.
    MINILLM_PANELS=0 turns it off."""
    if not gguf_cpu.loads_unless_turned_off(envs.MINILLM_PANELS, "0", load, "panel-packed few-row linear unavailable"):
        return False
    return bool(torch.ops.minillm_panel.simd())


def pack(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """weight [N, K] -> panels [ceil(N/32), K, 32] (zeros past N), written into `out` when given."""
    n, k = weight.shape
    np_ = -(-n // PANEL)
    padded = weight.detach().float()
    if n % PANEL:
        padded = torch.cat([padded, padded.new_zeros(np_ * PANEL - n, k)])
    panels = padded.view(np_, PANEL, k).transpose(1, 2)
    if out is None:
        return panels.contiguous()
    return out.view(np_, k, PANEL).copy_(panels)


def linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, n: int,
           portable: bool = False) -> torch.Tensor:
    """x [M, K] (M <= 16) @ W.T + bias -> [M, n], W given as its panels."""
    return torch.ops.minillm_panel.linear(x, panels, bias, n, portable)


def _linear_shape(x, panels, bias, n, portable=False):  # for torch.compile: the output's shape only
    return x.new_empty((x.shape[0], n))
