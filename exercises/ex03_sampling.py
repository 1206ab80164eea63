"""Exercise 03 -- top-k, top-p (nucleus) and min-p filtering (notebook 00 / 09, and 14_exercises).

minillm/engine/sampler.py divides the logits by the temperature, then calls this function for the
rows that sample; speculative decoding's verifier (spec_decode/rejection.py) calls it too, so a
request's settings mean the same with and without speculation.

top_p_min_p_filter(logits, top_p, min_p, top_k) -> logits
  logits [B, V] float; top_p, min_p [B] float; top_k [B] int (top_k >= V: off).
  Return a [B, V] tensor: the same logits where kept, -inf where dropped. Per row:
  1. top-k: keep the top_k[i] largest logits;
  2. top-p: among those, in order of probability (softmax over the kept ones), keep the smallest
     prefix whose total probability reaches top_p[i]. The token that crosses top_p stays; the most
     likely token always stays (top_p 1.0 keeps everything: careful, a float32 cumsum over
     49k tokens reaches 1.0 before the tail ends);
  3. min-p: drop every remaining token whose probability is below min_p[i] times the largest
     probability (min_p 0: off).
  Hints: logits.sort(dim=-1, descending=True) gives the order; cumsum of the sorted probabilities
  minus the token's own probability is "the mass before it"; masked_fill and scatter_ put the
  sorted mask back in vocabulary order. Off-by-one here is the classic bug: keep the crossing token.

Check: python -m exercises sampling
"""
from __future__ import annotations

import torch


def top_p_min_p_filter(logits: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                       top_k: torch.Tensor | None = None) -> torch.Tensor:
    raise NotImplementedError("exercise 03: top_p_min_p_filter (exercises/ex03_sampling.py)")
