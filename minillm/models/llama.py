"""One Llama-family decoder: Llama 2/3, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm), SmolLM2.

embed -> N x (RMSNorm, attention with RoPE and GQA, RMSNorm, SwiGLU MLP) -> norm -> lm_head

Q, K, V live in one fused ``qkv_proj`` and gate/up in one ``gate_up_proj``
(fewer, larger matmuls); ``load_weights`` maps Hugging Face's separate
tensors into their slices. The attention itself is delegated to a backend that
reads and writes the paged KV cache (minillm/attention). Gemma 3
(models/gemma3.py) subclasses this model and swaps its layers, embedding and RoPE.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from minillm.attention.base import AttentionBackend
from minillm.attention.metadata import AttentionMetadata
from minillm.config import ModelConfig
from minillm.models.layers import RMSNorm, RotaryEmbedding, make_mlp


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int = 0) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = (cfg.query_pre_attn_scalar or self.head_dim) ** -0.5
        # None: full causal attention; else a query at p sees keys in (p - window, p] (Gemma 3 local layers)
        self.sliding_window = cfg.layer_window(layer_idx)
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.o_proj.column_major_out = True  # read only by the residual add (minillm/cpu/skinny_linear.py)
        self.o_proj.read_by_residual_add = True
        unit = cfg.is_gemma3
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, unit) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, unit) if cfg.qk_norm else None
        # Bound by the KV pool (engine/kv_cache.py): this layer's slice of the paged cache,
        # its per-token-per-head scales when the cache is int8/fp8 (else None), and the backend.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        self.backend: AttentionBackend | None = None

    # RoPE on q and k heads side by side (a fast path's subclass may replace it: minillm/cpu/layers.py)
    rotate = staticmethod(RotaryEmbedding.apply)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        qk_size = self.q_size + self.kv_size
        # q and k heads side by side: [t, heads + kv_heads, head_dim], rotated in one call
        qk = qkv[:, :qk_size].view(t, self.num_heads + self.num_kv_heads, self.head_dim)
        v = qkv[:, qk_size:].view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, : self.num_heads]), self.k_norm(qk[:, self.num_heads :])), dim=1)
        qk = self.rotate(qk, *rope)  # cos/sin come from the model's one table (lookup, once a step)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        assert self.backend is not None, "the KV pool must be bound first (KVCachePool.bind)"
        o = self.backend.forward(q, k, v, self.k_cache, self.v_cache, meta, self.scale, self.k_scale, self.v_scale,
                                 window=self.sliding_window)
        return self.o_proj(o.reshape(t, self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = make_mlp(cfg)

    def forward(
        self,
        rope: tuple[torch.Tensor, torch.Tensor],
        x: torch.Tensor,
        residual: torch.Tensor | None,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(rope, x, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    # Hugging Face tensor name fragment -> (our fused parameter, which slice)
    packed = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    layer_cls: type[nn.Module] = DecoderLayer  # a subclass (models/gemma3.py) swaps the parts it changes

    def __init__(self, cfg: ModelConfig, max_positions: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.rotary = self.make_rotary(cfg, max_positions or cfg.max_position_embeddings)
        self.embed_tokens = self.make_embedding(cfg)
        self.layers = nn.ModuleList(self.layer_cls(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=cfg.is_gemma3)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @staticmethod
    def make_rotary(cfg: ModelConfig, max_positions: int) -> nn.Module:
        """``rotary.lookup(positions)``: the step's RoPE tables every layer reads; ``rotary.cos`` sizes the context."""
        return RotaryEmbedding(cfg, max_positions)

    @staticmethod
    def make_embedding(cfg: ModelConfig) -> nn.Embedding:
        return nn.Embedding(cfg.vocab_size, cfg.hidden_size)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn for layer in self.layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Packed tokens in, final hidden states out ([num_tokens, hidden])."""
        x = self.embed_tokens(input_ids)
        rope = self.rotary.lookup(positions)  # once per step, shared by all layers
        residual = None
        for layer in self.layers:
            x, residual = layer(rope, x, residual, meta)
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy Hugging Face-named tensors into our (partly fused) parameters.

        Returns the set of our parameter names that were written, so a loader can
        say exactly which ones a file is missing.
        """
        params = dict(self.named_parameters())
        written: set[str] = set()
        attn = self.layers[0].self_attn if len(self.layers) else None
        for name, tensor in weights:
            if "rotary_emb" in name:
                continue
            if name.startswith("model."):
                name = name[len("model.") :]
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            target, part = name, None
            for frag, (fused, p) in self.packed.items():
                if f".{frag}." in name:
                    target, part = name.replace(frag, fused), p
                    break
            if target not in params:
                raise KeyError(f"unexpected tensor {name!r} in the checkpoint")
            param = params[target]
            if part is None:
                dst = param
            elif isinstance(part, int):  # gate / up halves
                half = param.shape[0] // 2
                dst = param[part * half : (part + 1) * half]
            else:  # q / k / v slices of qkv_proj
                q, kv = attn.q_size, attn.kv_size
                start, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[part]
                dst = param[start : start + size]
            if dst.shape != tensor.shape:
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != expected {tuple(dst.shape)}")
            dst.copy_(tensor.to(dst.dtype))
            written.add(target if part is None else f"{target}[{part}]")
        if self.config.tie_word_embeddings:
            written.add("lm_head.weight")
        return written

    def expected_weights(self) -> set[str]:
        names: set[str] = set()
        for name, _ in self.named_parameters():
            base = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
            if base == "qkv_proj":
                names |= {f"{name}[q]", f"{name}[k]", f"{name}[v]"}
            elif base == "gate_up_proj":
                names |= {f"{name}[0]", f"{name}[1]"}
            else:
                names.add(name)
        if self.config.tie_word_embeddings:
            names.add("lm_head.weight")
        return names
