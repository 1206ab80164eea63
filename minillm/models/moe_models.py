"""Mixtral and Qwen2-MoE: the Llama-family decoder with its MLPs swapped for sparse MoE blocks (models/moe.py).

What differs from models/llama.py, checked against transformers' modeling_mixtral.py and
modeling_qwen2_moe.py (v5):

    Mixtral     every layer's MLP is an 8-expert top-2 MoE, weights renormalised; no shared expert
    Qwen2-MoE   q/k/v bias; a shared expert behind a sigmoid gate; layer i is MoE when
                (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers (else a dense MLP);
                renormalised only if norm_topk_prob

Attention, norms, RoPE, the KV cache and the engine interface are Llama's. The checkpoint
names differ: Mixtral calls the block `block_sparse_moe` and an expert's gate / down / up
`w1` / `w2` / `w3`; Qwen2-MoE uses `mlp` and gate_proj / down_proj / up_proj. Both, as
transformers' save_pretrained writes them, hold one tensor per expert; transformers' own
modules fuse them into 3-D tensors (`experts.gate_up_proj`, `experts.down_proj`), and a
checkpoint holding those loads too.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

import torch
from torch import nn

from minillm.config import ModelConfig
from minillm.models.layers import RMSNorm, make_mlp
from minillm.models.llama import Attention, DecoderLayer, LlamaForCausalLM
from minillm.models.moe import SparseMoeBlock

# one expert's tensor, as save_pretrained writes it: layer, expert, which matrix
PER_EXPERT = re.compile(r"layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
# transformers' fused layout: every expert of a layer in one 3-D tensor
FUSED = re.compile(r"layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(gate_up_proj|down_proj)$")
# an expert's matrix -> (our 3-D parameter, which half of gate_up; None: all of down_proj)
EXPERT_PARTS = {"w1": ("gate_up_proj", 0), "gate_proj": ("gate_up_proj", 0),
                "w3": ("gate_up_proj", 1), "up_proj": ("gate_up_proj", 1),
                "w2": ("down_proj", None), "down_proj": ("down_proj", None)}


class MoEDecoderLayer(DecoderLayer):
    """Llama's layer (same forward) whose MLP is a SparseMoeBlock on the config's MoE layers."""

    def __init__(self, cfg: ModelConfig, layer_idx: int = 0) -> None:
        nn.Module.__init__(self)  # not DecoderLayer's: it would build a dense MLP only to drop it
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SparseMoeBlock(cfg) if cfg.is_moe_layer(layer_idx) else make_mlp(cfg)


class SparseMoeForCausalLM(LlamaForCausalLM):
    """The decoder with MoE layers; loads per-expert or fused expert tensors into Experts' 3-D parameters."""

    layer_cls = MoEDecoderLayer

    def __init__(self, cfg: ModelConfig, max_positions: int | None = None) -> None:
        if not cfg.is_moe:
            raise ValueError(f"{type(self).__name__} needs num_experts > 0 (model_type {cfg.model_type!r})")
        super().__init__(cfg, max_positions)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Expert tensors go into their slices here; every other tensor through Llama's mapping."""
        written: set[str] = set()
        params = dict(self.named_parameters())

        def others() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if not self._load_expert(name, tensor, params, written):
                    yield name.replace(".block_sparse_moe.", ".mlp."), tensor

        return super().load_weights(others()) | written

    def _load_expert(self, name: str, tensor: torch.Tensor, params: dict[str, nn.Parameter],
                     written: set[str]) -> bool:
        """Copy `name` if it is an expert tensor (True); False for any other tensor."""
        if m := PER_EXPERT.search(name):
            layer, expert, matrix = int(m[1]), int(m[2]), m[3]
            if matrix not in EXPERT_PARTS:
                raise KeyError(f"unexpected tensor {name!r} in the checkpoint")
            target, half = EXPERT_PARTS[matrix]
            param = self._experts_param(name, layer, target, params)
            if expert >= param.shape[0]:
                raise ValueError(f"{name}: expert {expert} but the config has {param.shape[0]} experts")
            dst = param[expert]
            if half is not None:
                size = dst.shape[0] // 2
                dst = dst[half * size : (half + 1) * size]
            key = f"layers.{layer}.mlp.experts.{target}[{expert}]" + ("" if half is None else f"[{half}]")
        elif m := FUSED.search(name):
            layer, target = int(m[1]), m[2]
            dst = self._experts_param(name, layer, target, params)
            key = None
        else:
            return False
        if dst.shape != tensor.shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != expected {tuple(dst.shape)}")
        dst.copy_(tensor.to(dst.dtype))
        written |= {key} if key else self._expert_keys(layer, target)
        return True

    @staticmethod
    def _experts_param(name: str, layer: int, target: str, params: dict[str, nn.Parameter]) -> nn.Parameter:
        ours = f"layers.{layer}.mlp.experts.{target}"
        if ours not in params:  # a dense layer (mlp_only_layers), or a layer the config does not have
            raise KeyError(f"unexpected tensor {name!r} in the checkpoint (layer {layer} has no experts)")
        return params[ours]

    def _expert_keys(self, layer: int, target: str) -> set[str]:
        """The names load_weights records for every slice of one layer's 3-D expert parameter."""
        n = self.config.num_experts
        if target == "down_proj":
            return {f"layers.{layer}.mlp.experts.down_proj[{e}]" for e in range(n)}
        return {f"layers.{layer}.mlp.experts.gate_up_proj[{e}][{h}]" for e in range(n) for h in (0, 1)}

    def expected_weights(self) -> set[str]:
        names = set()
        for name in super().expected_weights():
            m = re.fullmatch(r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", name)
            names |= self._expert_keys(int(m[1]), m[2]) if m else {name}
        return names


class MixtralForCausalLM(SparseMoeForCausalLM):
    """Mixtral (model_type "mixtral"): every layer a top-k MoE with renormalised weights."""


class Qwen2MoeForCausalLM(SparseMoeForCausalLM):
    """Qwen2-MoE / Qwen1.5-MoE (model_type "qwen2_moe"): qkv bias, shared expert, dense layers where configured."""


MOE_MODELS: dict[str, type[SparseMoeForCausalLM]] = {"mixtral": MixtralForCausalLM, "qwen2_moe": Qwen2MoeForCausalLM}
