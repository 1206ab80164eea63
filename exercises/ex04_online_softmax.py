"""Exercise 04 -- the online softmax tile update of FlashAttention (notebook 04, and 14_exercises).

The prefill kernel (kernels/prefill.py) never writes the [queries, keys] score matrix: it visits
the keys in tiles and keeps, per query row, a running max m, a running sum l of exp(score - m) and
an unnormalised output acc = sum exp(score - m) * v. After the last tile, out = acc / l. The tiled
PyTorch backend (minillm/attention/tiled_backend.py, LLM(attention_backend="tiled")) runs the same
loop and calls this function once per tile.

online_softmax_update(m, l, acc, scores, v) -> (m, l, acc)
  m [..., R] running max (-inf before any key), l [..., R] running sum, acc [..., R, D];
  scores [..., R, N] this tile's scaled scores, -inf where masked; v [..., N, D] this tile's values.
  Fold the tile in: the new max is max(m, max of the tile); everything summed so far was relative
  to the old max, so scale l and acc by exp(m_old - m_new) before adding the tile's exp(score -
  m_new) (and their product with v).
  Edge case: a row may have seen no visible key yet (its max is still -inf); -inf - -inf is NaN,
  so use 0 in place of a -inf max inside the exponentials. Large scores (100+) must not overflow.

Check: python -m exercises online_softmax
"""
from __future__ import annotations

import torch


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor,
                          v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError("exercise 04: online_softmax_update (exercises/ex04_online_softmax.py)")
