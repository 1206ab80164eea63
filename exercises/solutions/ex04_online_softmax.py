"""A worked answer to exercise 04 (exercises/ex04_online_softmax.py)."""
from __future__ import annotations

import torch


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor,
                          v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m_new = torch.maximum(m, scores.amax(dim=-1))
    # a row with no visible key yet has max -inf: use 0 in the exponentials (exp(-inf - 0) = 0, no NaN)
    shift = torch.nan_to_num(m_new, neginf=0.0)
    rescale = torch.exp(m - shift)  # old terms were relative to m; now to m_new
    p = torch.exp(scores - shift.unsqueeze(-1))
    l_new = rescale * l + p.sum(dim=-1)
    acc_new = rescale.unsqueeze(-1) * acc + p @ v
    return m_new, l_new, acc_new
