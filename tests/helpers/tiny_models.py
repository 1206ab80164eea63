"""Tiny random models of every supported family, saved as Hugging Face folders.

    folder, hf_model = make_tiny_hf_model(tmp_path, "qwen3")
    loaded = minillm.loader.load_model(str(folder))

Each family covers a different corner of the one Llama implementation:

    llama    GQA (4 q heads / 2 kv), Llama 3 RoPE scaling, untied lm_head
    mistral  MHA (4 / 4), tied embeddings, sliding_window larger than the context
    qwen2    MQA (4 / 1), q/k/v bias, tied embeddings
    qwen3    GQA (4 / 2), q/k RMSNorm, head_dim 24 != hidden / heads, untied, sharded safetensors

Weights are random; norms and biases are randomised too (transformers
initialises them to ones / zeros, which would hide a mis-mapped norm or bias).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, PreTrainedModel, Qwen2Config, Qwen3Config

from tests.helpers.tiny_tokenizer import BOS, EOS, PAD, VOCAB_SIZE, make_tiny_tokenizer

# Padded past the tokenizer's 320 like real checkpoints (Qwen2's tokenizer class adds a token of its own).
VOCAB = VOCAB_SIZE + 16
COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    initializer_range=0.2,  # 10x the default: greedy continuations vary instead of repeating one token
    bos_token_id=BOS,
    eos_token_id=EOS,
    pad_token_id=PAD,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,  # small, so some frequencies are scaled, some blended
}
FAMILIES: dict[str, tuple[type, dict[str, Any]]] = {
    "llama": (LlamaConfig, dict(num_key_value_heads=2, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False)),
    "mistral": (MistralConfig, dict(num_key_value_heads=4, sliding_window=4096, tie_word_embeddings=True)),
    "qwen2": (Qwen2Config, dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "qwen3": (Qwen3Config, dict(num_key_value_heads=2, head_dim=24, tie_word_embeddings=False)),
}
SHARD_SIZE = {"qwen3": "40KB"}  # one family goes through model.safetensors.index.json


@torch.no_grad()
def _randomize_norms_and_biases(model: PreTrainedModel, gen: torch.Generator) -> None:
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def make_tiny_hf_model(
    tmp_path: Path, family: str, *, max_shard_size: str | None = None, seed: int = 0, **overrides: Any
) -> tuple[Path, PreTrainedModel]:
    """Build, save and return (folder, transformers model in fp32 eval mode) for one family.

    overrides go to the family's transformers config (e.g. num_hidden_layers=3).
    """
    config_cls, family_kwargs = FAMILIES[family]
    config = config_cls(**{**COMMON, **family_kwargs, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize_norms_and_biases(model, torch.Generator().manual_seed(seed))
    model.eval()
    folder = Path(tmp_path) / f"tiny-{family}"
    model.save_pretrained(folder, max_shard_size=max_shard_size or SHARD_SIZE.get(family, "1GB"))
    make_tiny_tokenizer().save_pretrained(folder)
    return folder, model
