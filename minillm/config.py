"""The model's shape (ModelConfig); the engine's knobs are one EngineConfig in minillm/engine/config.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ModelConfig:
    """Shape of a Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2) or of Gemma 3.

    Field names follow Hugging Face's config.json so a folder's config maps 1:1.
    The fields after ``model_type`` are Gemma 3's (defaults: what Llama does).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None  # Qwen3 sets it explicitly; else hidden / heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # e.g. {"rope_type": "llama3", ...}
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    model_type: str = "llama"
    # Gemma 3 (model_type "gemma3"): sandwich norms, RMSNorm x * (1 + w), GeGLU, scaled embeddings
    hidden_activation: str = "silu"  # the MLP gate: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU)
    query_pre_attn_scalar: float | None = None  # softmax scale is this ** -0.5; None: head_dim
    sliding_window: int | None = None  # a query at p sees keys in (p - window, p] on sliding layers
    layer_types: list[str] | None = None  # per layer "sliding_attention" | "full_attention"; None: all full
    rope_local_base_freq: float | None = None  # RoPE theta of the sliding layers; None: rope_theta
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        if self.layer_types is not None and "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    @property
    def is_gemma3(self) -> bool:
        return self.model_type == "gemma3"

    def layer_window(self, i: int) -> int | None:
        """Layer i's sliding window, or None for full (global) attention."""
        if self.layer_types is None or self.layer_types[i] != "sliding_attention":
            return None
        return self.sliding_window

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V of one token over all layers as stored (an int8/fp8 cache adds its scales)."""
        from minillm.attention.kv_quant import kv_bytes_per_token

        return kv_bytes_per_token(self.num_hidden_layers, self.num_key_value_heads, self.head_dim, dtype)

    def num_parameters(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        if self.attention_bias:
            per_layer += q + 2 * kv
        if self.qk_norm:
            per_layer += 2 * d
        if self.is_gemma3:  # pre- and post-feedforward norms besides the usual two
            per_layer += 2 * h
        emb = self.vocab_size * h
        return self.num_hidden_layers * per_layer + emb * (1 if self.tie_word_embeddings else 2) + h

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        eos = d.get("eos_token_id")
        eos_list = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        model_type = d.get("model_type", "llama")
        if model_type == "gemma3_text":  # transformers' name for Gemma 3's text-only model
            return cls._from_gemma3_dict(d, eos_list)
        rope_scaling = d.get("rope_scaling")
        rope_theta = d.get("rope_theta")
        rope_params = d.get("rope_parameters")  # transformers >= 5 nests rope settings here
        if isinstance(rope_params, dict):
            rope_theta = rope_theta or rope_params.get("rope_theta")
            if rope_params.get("rope_type", "default") != "default" and rope_scaling is None:
                rope_scaling = dict(rope_params)
        if rope_scaling is not None and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default":
            rope_scaling = None
        return cls(
            **_shape_fields(d),
            head_dim=d.get("head_dim"),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta or 10000.0),
            rope_scaling=rope_scaling,
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=d.get("attention_bias", model_type == "qwen2"),
            qk_norm=model_type == "qwen3",
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos_list,
            model_type=model_type,
        )

    @classmethod
    def _from_gemma3_dict(cls, d: dict[str, Any], eos_list: list[int]) -> "ModelConfig":
        """A transformers Gemma3TextConfig dict (v4: rope_theta / rope_local_base_freq; v5: rope_parameters)."""
        if d.get("attn_logit_softcapping") is not None:
            raise ValueError("attention logit softcapping (attn_logit_softcapping) is not supported")
        if d.get("use_bidirectional_attention"):
            raise ValueError("bidirectional attention (use_bidirectional_attention) is not supported")
        n = d["num_hidden_layers"]
        layer_types = d.get("layer_types") or [  # transformers' default: every 6th layer global
            "full_attention" if (i + 1) % d.get("sliding_window_pattern", 6) == 0 else "sliding_attention"
            for i in range(n)]
        rp = d.get("rope_parameters") or {}
        full, local = rp.get("full_attention") or {}, rp.get("sliding_attention") or {}
        scaling = d.get("rope_scaling") or (full if full.get("rope_type", "default") != "default" else None)
        if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "default":
            scaling = None
        return cls(
            **_shape_fields(d),
            head_dim=d.get("head_dim", 256),
            max_position_embeddings=d.get("max_position_embeddings", 131072),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(d.get("rope_theta") or full.get("rope_theta") or 1e6),
            rope_scaling=dict(scaling) if scaling else None,
            tie_word_embeddings=d.get("tie_word_embeddings", True),
            attention_bias=d.get("attention_bias", False),
            qk_norm=True,
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos_list,
            model_type="gemma3",
            hidden_activation=d.get("hidden_activation") or "gelu_pytorch_tanh",
            query_pre_attn_scalar=float(d.get("query_pre_attn_scalar", 256)),
            sliding_window=d.get("sliding_window", 4096),
            layer_types=list(layer_types),
            rope_local_base_freq=float(d.get("rope_local_base_freq") or local.get("rope_theta") or 10000.0),
            final_logit_softcapping=d.get("final_logit_softcapping"),
        )


def _shape_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The fields every family's config.json names alike (the rest differ in names or defaults)."""
    return dict(
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=d["num_attention_heads"],
        num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
    )
