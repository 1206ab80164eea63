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
    # Mixture of experts (model_type "mixtral" / "qwen2_moe"; models/moe.py). num_experts 0: dense MLPs.
    num_experts: int = 0  # routed experts per MoE layer (Mixtral's config calls it num_local_experts)
    num_experts_per_tok: int = 0  # top-k: experts each token is sent to
    moe_intermediate_size: int | None = None  # one expert's hidden width; None: intermediate_size
    norm_topk_prob: bool = True  # renormalise the top-k softmax weights to sum to 1 (Mixtral always does)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: an always-on expert behind a sigmoid gate; 0: none
    decoder_sparse_step: int = 1  # layer i is MoE when (i + 1) % step == 0 ...
    mlp_only_layers: list[int] = field(default_factory=list)  # ... and i is not listed here (dense MLP)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_experts:
            self._check_moe()
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        if self.layer_types is not None and "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    def _check_moe(self) -> None:
        e, k = self.num_experts, self.num_experts_per_tok
        if k < 1 or k > e:
            raise ValueError(f"num_experts_per_tok={k} must be between 1 and num_experts={e}")
        if self.decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step must be >= 1, got {self.decoder_sparse_step}")
        if self.moe_intermediate_size is None:
            self.moe_intermediate_size = self.intermediate_size

    @property
    def is_gemma3(self) -> bool:
        return self.model_type == "gemma3"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, i: int) -> bool:
        """Does layer i route tokens to experts (else: one dense MLP)? Qwen2-MoE's rule; Mixtral: every layer."""
        return self.is_moe and (i + 1) % self.decoder_sparse_step == 0 and i not in self.mlp_only_layers

    def mlp_parameters(self, i: int, active: bool = False) -> int:
        """Weights of layer i's MLP; active=True: only those one token's forward multiplies by
        (the router, its top-k experts, the shared expert and its gate) -- the MoE's compute per token."""
        h = self.hidden_size
        if not self.is_moe_layer(i):
            return 3 * h * self.intermediate_size
        experts = self.num_experts_per_tok if active else self.num_experts
        n = h * self.num_experts + experts * 3 * h * self.moe_intermediate_size
        if self.shared_expert_intermediate_size:
            n += 3 * h * self.shared_expert_intermediate_size + h
        return n

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
        per_layer = h * (q + 2 * kv) + q * h + 2 * h  # attention and the two norms; MLPs below
        if self.attention_bias:
            per_layer += q + 2 * kv
        if self.qk_norm:
            per_layer += 2 * d
        if self.is_gemma3:  # pre- and post-feedforward norms besides the usual two
            per_layer += 2 * h
        emb = self.vocab_size * h
        mlps = sum(self.mlp_parameters(layer) for layer in range(self.num_hidden_layers))
        return self.num_hidden_layers * per_layer + mlps + emb * (1 if self.tie_word_embeddings else 2) + h

    def weight_bytes(self, bytes_per_weight: float) -> float:
        """Bytes of weights one step streams: every matmul weight plus the LM head (engine/cost.py).

        The embedding table is a gather (a few rows), so it only counts when it is
        also the LM head (tied).
        """
        return self.num_parameters() * bytes_per_weight - (
            0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size * bytes_per_weight
        )

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        eos = d.get("eos_token_id")
        eos_list = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        model_type = d.get("model_type", "llama")
        if model_type == "gemma3_text":  # transformers' name for Gemma 3's text-only model
            return cls._from_gemma3_dict(d, eos_list)
        moe = _moe_fields(d) if model_type in ("mixtral", "qwen2_moe") else {}
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
            attention_bias=d.get("attention_bias", d.get("qkv_bias", model_type in ("qwen2", "qwen2_moe"))),
            qk_norm=model_type == "qwen3",
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos_list,
            model_type=model_type,
            **moe,
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


def _moe_fields(d: dict[str, Any]) -> dict[str, Any]:
    """Mixtral's and Qwen2-MoE's expert settings, in ModelConfig's names (transformers' defaults where absent)."""
    if d["model_type"] == "mixtral":  # every layer MoE, softmax -> top-k -> renormalised, no shared expert
        return dict(num_experts=d.get("num_local_experts", 8), num_experts_per_tok=d.get("num_experts_per_tok", 2),
                    moe_intermediate_size=d["intermediate_size"], norm_topk_prob=True)
    if d.get("num_experts", 60) == 0:  # transformers: no experts means every layer is a dense MLP
        return {}
    return dict(
        num_experts=d.get("num_experts", 60),
        num_experts_per_tok=d.get("num_experts_per_tok", 4),
        moe_intermediate_size=d.get("moe_intermediate_size", 1408),
        norm_topk_prob=bool(d.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=d.get("shared_expert_intermediate_size", 5632),
        decoder_sparse_step=d.get("decoder_sparse_step", 1),
        mlp_only_layers=list(d.get("mlp_only_layers") or []),
    )
