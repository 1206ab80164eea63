"""Run a model outside the engine: one prompt, a private KV pool, all logits.

Used by tests (compare with transformers), perplexity evaluation and
notebooks that want a plain forward without scheduling.
"""
from __future__ import annotations

import torch

from minillm.attention.metadata import AttentionMetadata
from minillm.attention.torch_backend import TorchAttentionBackend
from minillm.models.llama import LlamaForCausalLM


def attach_private_cache(model: LlamaForCausalLM, num_tokens: int, block_size: int = 16, backend=None) -> list[int]:
    """Give every attention layer a float pool just big enough for num_tokens; returns the block table."""
    from minillm.engine.kv_cache import KVCachePlan, KVCachePool

    cfg = model.config
    nb = -(-num_tokens // block_size)
    dtype = model.embed_tokens.weight.dtype
    plan = KVCachePlan(nb, block_size, dtype, cfg.kv_bytes_per_token(dtype) * block_size)
    KVCachePool(cfg, plan, model.embed_tokens.weight.device).bind(model, backend or TorchAttentionBackend())
    return list(range(nb))


@torch.inference_mode()
def forward_logits(model: LlamaForCausalLM, token_ids: list[int], block_size: int = 16, backend=None) -> torch.Tensor:
    """Logits for every position of one sequence, float32 [len, vocab]."""
    n = len(token_ids)
    table = attach_private_cache(model, n, block_size, backend)
    device = model.embed_tokens.weight.device
    meta = AttentionMetadata.build([n], [n], [table], block_size, device)
    ids = torch.tensor(token_ids, device=device)
    pos = torch.arange(n, device=device)
    return model.compute_logits(model(ids, pos, meta))
