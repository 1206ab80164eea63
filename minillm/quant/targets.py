"""The linears a quantizer replaces, and the edits it makes to the model to put its layers in place.

Shared by every method (minillm.quant.apply, gptq.py, smoothquant.py, fp8.py), below all of them.
"""
from __future__ import annotations

import torch
from torch import nn

from minillm.models.llama import LlamaForCausalLM

TARGETS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def target_linears(model: LlamaForCausalLM) -> dict[str, nn.Module]:
    mods = dict(model.named_modules())
    return {f"layers.{i}.{t}": mods[f"layers.{i}.{t}"] for i in range(len(model.layers)) for t in TARGETS}


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put `new` where the submodule `name` (dotted, as named_modules gives it) sits in `model`: how each
    quantizer puts its quantized linear in place of the float one."""
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent), attr, new)


def divide_norm(norm, s: torch.Tensor) -> None:
    """Fold 1/s into an RMSNorm's scale; a Gemma norm scales by (1 + w), so w becomes (1 + w) / s - 1."""
    if getattr(norm, "unit_offset", False):
        norm.weight.copy_(((1.0 + norm.weight.float()) / s - 1.0).to(norm.weight.dtype))
    else:
        norm.weight /= s.to(norm.weight.dtype)
