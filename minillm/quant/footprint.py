"""Bytes a batch-1 decode step reads: the weights (as stored) and the KV cache per token.

Counted from the tensors the model actually holds, so a quantized model's
figure is what its QuantLinear buffers occupy (codes + scales + zeros), not a
formula. Per decoded token every matmul weight is read once; the embedding
is a gather of one row, so an untied embedding table does not count, a tied
one does (it is the LM head) -- unless the LM head is quantized on its own
(minillm.quant.apply.quantize_lm_head): then its int8 copy is what is read.
"""
from __future__ import annotations

import torch
from torch import nn

from minillm.quant.gguf_linear import GGUFLinear
from minillm.quant.linear import QuantLinear
from minillm.quant.fp8 import FP8Linear
from minillm.quant.w8a8 import W8A8Linear

PACKED = (QuantLinear, GGUFLinear, W8A8Linear, FP8Linear)  # weights in buffers (codes, scales, blocks)


def _unique_bytes(tensors: list[torch.Tensor]) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def weight_bytes_per_token(model: nn.Module) -> int:
    """Bytes of weights one batch-1 decode step streams (parameters + QuantLinear buffers; not RoPE tables)."""
    embed = model.embed_tokens.weight
    head = getattr(model.lm_head, "weight", None)  # a quantized head (QuantLinear, GGUFLinear) has none
    tied = head is not None and head.data_ptr() == embed.data_ptr()
    tensors = [p for n, p in model.named_parameters(remove_duplicate=False) if tied or p.data_ptr() != embed.data_ptr()]
    for m in model.modules():
        if isinstance(m, PACKED):
            tensors += [b for b in m.buffers()]
    return _unique_bytes(tensors)


def bytes_per_weight(model: nn.Module) -> float:
    """Stored bytes per weight that a step streams: the element size, or a quantized model's average."""
    if not any(isinstance(m, PACKED) for m in model.modules()):
        return float(model.embed_tokens.weight.element_size())
    return weight_bytes_per_token(model) / model.config.weight_bytes(1.0)


def model_bytes(model: nn.Module) -> int:
    """Bytes of every weight the model keeps in memory (the embedding table included)."""
    tensors = list(model.parameters())
    for m in model.modules():
        if isinstance(m, PACKED):
            tensors += list(m.buffers())
    return _unique_bytes(tensors)
