"""A worked answer to exercise 05 (exercises/ex05_rejection.py)."""
from __future__ import annotations

import torch


def accept_or_resample(p: torch.Tensor, q: torch.Tensor | None, token: int, u: float) -> torch.Tensor | None:
    q_x = 1.0 if q is None else float(q[token])  # a deterministic proposer: q is one-hot on token
    if u * q_x < float(p[token]):  # u < min(1, p/q), without dividing by a zero q
        return None
    if q is None:
        residual = p.clone()
        residual[token] = 0.0
    else:
        residual = torch.clamp(p - q, min=0.0)
    total = float(residual.sum())
    return residual / total if total > 0 else p
