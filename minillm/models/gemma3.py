"""Gemma 3 (text): the Llama-family decoder with Gemma's differences swapped in.

embed * sqrt(hidden) -> N x (RMSNorm, attention, RMSNorm, +, RMSNorm, GeGLU, RMSNorm, +) -> norm -> tied head

What differs from models/llama.py, each checked against transformers' modeling_gemma3.py:
- four norms per layer ("sandwich"): the attention and MLP outputs are normed again
  before they join the residual stream; every RMSNorm scales by (1 + w);
- GeGLU MLP (tanh-approximate GELU), q/k norms, softmax scale query_pre_attn_scalar ** -0.5;
- sliding-window attention on the local layers (config.layer_types), each with its own
  RoPE theta (rope_local_base_freq, 10k) while the global layers use rope_theta (1M);
- optional final logit softcapping.
The fused qkv / gate_up parameters, load_weights and the engine interface are Llama's.
"""
from __future__ import annotations

import torch
from torch import nn

from minillm.attention.metadata import AttentionMetadata
from minillm.config import ModelConfig
from minillm.models.layers import RMSNorm, RotaryEmbedding, ScaledEmbedding, make_mlp
from minillm.models.llama import Attention, LlamaForCausalLM

Rope = tuple[torch.Tensor, torch.Tensor]


class Gemma3Rotary(nn.Module):
    """Two RoPE tables: global layers (rope_theta, scaled if configured) and sliding layers (local theta)."""

    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.full = RotaryEmbedding(cfg, max_positions)
        self.local = RotaryEmbedding(cfg, max_positions, local=True)

    @property
    def cos(self) -> torch.Tensor:  # the engine sizes the context from the table length
        return self.full.cos

    def lookup(self, positions: torch.Tensor) -> tuple[Rope, Rope]:
        """(full, local) cos/sin pairs, looked up once per step; each layer takes the one it needs."""
        return self.full.lookup(positions), self.local.lookup(positions)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int = 0) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps, unit_offset=True)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(h, eps, unit_offset=True)
        self.pre_feedforward_layernorm = RMSNorm(h, eps, unit_offset=True)
        self.mlp = make_mlp(cfg)
        self.post_feedforward_layernorm = RMSNorm(h, eps, unit_offset=True)

    def forward(
        self, rope: tuple[Rope, Rope], x: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Same carry as Llama's layer: returns (branch output, residual) and the next norm adds them."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(rope[1] if self.self_attn.sliding_window else rope[0], x, meta)
        x, residual = self.pre_feedforward_layernorm(self.post_attention_layernorm(x), residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class Gemma3ForCausalLM(LlamaForCausalLM):
    layer_cls = Gemma3DecoderLayer

    @staticmethod
    def make_rotary(cfg: ModelConfig, max_positions: int) -> nn.Module:
        return Gemma3Rotary(cfg, max_positions)

    @staticmethod
    def make_embedding(cfg: ModelConfig) -> nn.Embedding:
        return ScaledEmbedding(cfg.vocab_size, cfg.hidden_size)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

