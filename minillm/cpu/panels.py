"""The body's weights packed again in panels of 32 outputs, for engines whose steps multiply a few rows.

A speculative engine's verify step multiplies every weight by k + 1 rows (a draft tree's 4-6).
nn.Linear's row-major weights make that cost ~1.1 one-row reads on the CPU; packed in panels
([ceil(N/32), K, 32], minillm/cpu/kernels/panel_f32.cpp) it costs about one. The default model's 120 body
linears, 2-vCPU Zen 5, two threads, row-major -> panels, ms: 1 row 9.40 -> 9.57, 2 rows 9.47 ->
9.43, 3 rows 9.74 -> 9.56, 4 rows 10.76 -> 9.80, 8 rows 10.81 -> 9.88 (read probe 49 GB/s); 4 / 8
rows 9.98 -> 9.31 / 10.44 -> 9.46 at 82 GB/s. So 4-8 rows read the panels (SkinnyLinear's
PANEL_ROWS). Hydra's tree `0/1/0-0` on the chat prompts, two copies of the model in one process,
eight alternated rounds: with panels x1.02-1.09 faster a round (median x1.04), same tokens.
The panels are a second copy (the row-major weights stay: prefill, one-row decode, training and
every other reader use them), so the engine packs them only where it gains:

- a float32 model on a CPU whose build has the kernel's AVX-512 path (`panel_cpu.available()`);
- eager decode (a compiled step reads its own layouts, engine/compile.py);
- speculative decoding configured, or MINILLM_PANELS=1 (small batches, a few users);
- room for the copy: at most a quarter of the memory the OS reports available.

Only the decoder layers' linears are packed: the LM head is tied to the embedding table in most
small models, and a 4-row product over it costs ~1.07 one-row products already. `MINILLM_PANELS=0`
turns the panels off. A SkinnyLinear whose weight is replaced or written after packing drops its
stale panels on its next call (`SkinnyLinear.panels_current`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minillm import envs
from minillm.cpu.huge_pages import huge_page_empty, huge_pages_enabled
from minillm.cpu.kernels import panel_cpu
from minillm.host import meminfo_bytes

PANELS_ENV = envs.MINILLM_PANELS  # "0": never; "1": every eager float32 CPU engine; unset: speculative engines


@dataclass
class PanelReport:
    """What pack_panels did: layers packed now, layers whose panels were current already, bytes, or why not."""

    layers: int = 0
    already: int = 0
    nbytes: int = 0
    skipped: str = ""

    def __str__(self) -> str:
        if self.skipped:
            return f"no few-row panels: {self.skipped}"
        return (f"{self.layers + self.already} linears in few-row panels ({self.nbytes / 2**20:.0f} MiB"
                + (f"; {self.already} packed before)" if self.already else ")"))


def panels_wanted(model: nn.Module, config) -> str:
    """"" where this engine should pack panels, else the reason it should not."""
    setting = envs.panels()
    if setting == "0":
        return f"{PANELS_ENV}=0"
    if config.compile:
        return "a compiled step reads its own layouts"
    if setting != "1" and config.speculative is None:
        return f"no speculative decoding (set {PANELS_ENV}=1 for small batches)"
    weight = model.embed_tokens.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return "not a float32 CPU model"
    if not panel_cpu.available():
        return "the panel kernel's AVX-512 path is not built here"
    return ""


def body_linears(model: nn.Module) -> list[nn.Module]:
    from minillm.cpu.skinny_linear import SkinnyLinear

    return [m for m in model.layers.modules() if isinstance(m, SkinnyLinear) and m.weight.dtype == torch.float32]


def pack_panels(model: nn.Module) -> PanelReport:
    """Pack each decoder-layer SkinnyLinear's weight into panels (one 2 MB-page arena for all of them
    where the machine has huge pages: each verify step streams them)."""
    body = body_linears(model)
    todo = [m for m in body if not m.panels_current()]
    already = len(body) - len(todo)
    sizes = [-(-m.out_features // panel_cpu.PANEL) * panel_cpu.PANEL * m.in_features * 4 for m in todo]
    total = sum(sizes)
    free = meminfo_bytes("MemAvailable")
    if total and free is not None and 4 * total > free:
        return PanelReport(skipped=f"the copy ({total / 2**20:.0f} MiB) would take over a quarter of the "
                                   f"{free / 2**20:.0f} MiB available")
    arena = huge_page_empty(total) if total and huge_pages_enabled() else None
    if arena is None and total:
        arena = torch.empty(total, dtype=torch.uint8)
    offset = 0
    with torch.no_grad():
        for m, nbytes in zip(todo, sizes):
            out = arena[offset : offset + nbytes].view(torch.float32)
            m.set_panels(panel_cpu.pack(m.weight, out=out).view(-1, m.in_features, panel_cpu.PANEL))
            offset += nbytes
    done = sum(m.panels.numel() * 4 for m in body if m.panels is not None)
    return PanelReport(layers=len(todo), already=already, nbytes=done)
