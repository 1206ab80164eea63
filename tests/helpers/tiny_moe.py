"""Tiny random mixture-of-experts models built with transformers and saved as Hugging Face folders.

    folder, hf_model = make_tiny_moe(tmp_path, "qwen2_moe")
    loaded = minillm.loader.load_model(str(folder))

    mixtral         2 layers, 4 experts, top-2 renormalised, GQA 4 / 2, untied head
    qwen2_moe       3 layers (layer 1 a dense MLP: mlp_only_layers), 8 experts, top-2 *not* renormalised,
                    a shared expert behind its sigmoid gate, q/k/v bias, tied embeddings
    qwen2_moe_step  2 layers, decoder_sparse_step 2 (layer 0 dense, layer 1 MoE), norm_topk_prob on

Weights are random (initializer_range 0.2, so routing differs from token to token), norms
and biases randomised too (tests/helpers/tiny_models.py says why).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, MixtralConfig, PreTrainedModel, Qwen2MoeConfig

from tests.helpers.tiny_models import COMMON, _randomize_norms_and_biases
from tests.helpers.tiny_tokenizer import make_tiny_tokenizer

QWEN = dict(num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, tie_word_embeddings=True)
MOE_FAMILIES: dict[str, tuple[type, dict[str, Any]]] = {
    "mixtral": (MixtralConfig, dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                    intermediate_size=96, tie_word_embeddings=False)),
    "qwen2_moe": (Qwen2MoeConfig, dict(QWEN, num_hidden_layers=3, mlp_only_layers=[1], norm_topk_prob=False)),
    "qwen2_moe_step": (Qwen2MoeConfig, dict(QWEN, decoder_sparse_step=2, norm_topk_prob=True,
                                            tie_word_embeddings=False)),
}


def make_tiny_moe(tmp_path: Path, family: str, seed: int = 0, **overrides: Any) -> tuple[Path, PreTrainedModel]:
    """Build, save and return (folder, transformers model in fp32 eval mode)."""
    config_cls, kwargs = MOE_FAMILIES[family]
    config = config_cls(**{**COMMON, **kwargs, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize_norms_and_biases(model, torch.Generator().manual_seed(seed))
    model.eval()
    folder = Path(tmp_path) / f"tiny-{family}"
    model.save_pretrained(folder)
    make_tiny_tokenizer().save_pretrained(folder)
    return folder, model
