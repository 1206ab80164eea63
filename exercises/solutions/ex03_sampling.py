"""A worked answer to exercise 03 (exercises/ex03_sampling.py)."""
from __future__ import annotations

import torch


def top_p_min_p_filter(logits: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                       top_k: torch.Tensor | None = None) -> torch.Tensor:
    vocab = logits.shape[-1]
    if top_k is None:
        top_k = torch.full((logits.shape[0],), vocab, device=logits.device)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)[None, :]
    drop = rank >= top_k[:, None]  # 1. top-k: ranks past k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    # 2. top-p: the token crossing top_p has mass_before < top_p; top_p 1.0 is off (a float32
    #    cumsum reaches 1.0 before a 49k-token tail ends)
    drop |= (mass_before >= top_p[:, None]) & (top_p < 1.0)[:, None]
    drop[:, 0] = False  # the most likely token always stays
    probs = probs.masked_fill(drop, 0.0)
    drop |= probs < min_p[:, None] * probs[:, :1]  # 3. min-p: relative to the largest (sorted first)
    kept = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, kept)  # back to vocabulary order
