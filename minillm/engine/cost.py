"""Analytic FLOPs and bytes of one engine step, for the roofline.

Counted from the model config and the batch (matmuls as 2*m*n*k FLOPs):
weights are read once per step whatever the batch, every new token's
attention reads the K/V of all keys it attends to, and each new token
writes its own K/V once. A mixture-of-experts layer costs a token its router,
its top-k experts and any shared expert (ModelConfig.mlp_parameters(active=True));
its weight bytes count every expert, which a step reads once each has a token
(an upper bound for small decode batches).
"""
from __future__ import annotations

import sys

from dataclasses import dataclass

from minillm.config import ModelConfig


@dataclass(frozen=True)
class StepCost:
    flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float

    @property
    def bytes_moved(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes


@dataclass(frozen=True)
class ModelCosts:
    """What every step of one model costs alike: its layers' matmul FLOPs per token and its weight bytes.
    The sums over layers took ~40 us a step; an owner that steps one model (the tracer, a draft) computes
    them once and passes them to step_cost."""

    linear_flops_per_token: float
    weight_bytes: float


def model_costs(cfg: ModelConfig, bytes_per_weight: float) -> ModelCosts:
    h, d, layers = cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    mlp = sum(cfg.mlp_parameters(i, active=True) for i in range(layers))
    return ModelCosts(2 * (layers * (h * (q + 2 * kv) + q * h) + mlp), cfg.weight_bytes(bytes_per_weight))


def step_cost(
    cfg: ModelConfig,
    chunks: list[tuple[int, int]],  # (num_new_tokens, context_len after the step) per sequence
    num_logits: int,
    bytes_per_weight: float,
    bytes_per_kv_elem: float,  # as stored: int8/fp8 caches add their per-token-per-head fp32 scale
    fixed: ModelCosts | None = None,  # model_costs(cfg, bytes_per_weight), when the caller keeps it
) -> StepCost:
    h, d, layers = cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers
    kv = cfg.num_key_value_heads * d
    fixed = fixed or model_costs(cfg, bytes_per_weight)
    tokens = sum(n for n, _ in chunks)
    attn = 0.0
    kv_read = 0.0
    for n, ctx in chunks:
        # keys seen by the chunk's queries: causal, the i-th of n sees ctx - n + i + 1
        keys = n * (ctx - n) + n * (n + 1) / 2
        attn += 2 * 2 * layers * cfg.num_attention_heads * d * keys  # QK^T and PV
        kv_read += ctx * 2 * layers * kv * bytes_per_kv_elem  # each key and value read once per step
    flops = fixed.linear_flops_per_token * tokens + attn + 2 * h * cfg.vocab_size * num_logits
    kv_write = tokens * 2 * layers * kv * bytes_per_kv_elem
    return StepCost(flops, fixed.weight_bytes, kv_read, kv_write)


def bytes_per_weight(model: torch.nn.Module) -> float:
    """Stored bytes per weight a decode step streams: the element size, or a quantized model's average
    (quant/footprint.py). A model holds quantized layers only once minillm.quant.linear was imported."""
    if "minillm.quant.linear" not in sys.modules:
        return float(model.embed_tokens.weight.element_size())
    from minillm.quant.footprint import bytes_per_weight as quantized

    return quantized(model)
