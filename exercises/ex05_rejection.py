"""Exercise 05 -- speculative decoding's rejection rule (notebook 09, and 14_exercises).

A proposer guesses a token x drawn from its distribution q; the target model's distribution is p.
Accepting x with probability min(1, p(x) / q(x)) and, on rejection, drawing the replacement from
max(p - q, 0) normalised makes every emitted token distributed exactly as p (Leviathan et al.
2023; Chen et al. 2023). minillm/spec_decode/rejection.py (verify_tokens, verify_tree) calls this
function for every draft token.

accept_or_resample(p, q, token, u) -> torch.Tensor | None
  p [V] the target's probabilities; q [V] the proposer's, or None for a deterministic proposer
  (n-gram lookup: q is one-hot on the token); token the guessed id x; u a uniform draw in [0, 1).
  Return None when x is accepted (u < min(1, p(x)/q(x))); else the [V] distribution the
  replacement is drawn from: max(p - q, 0) divided by its sum. With q None that is p with x
  removed, renormalised. If nothing is left (p == q up to rounding), return p.

Check: python -m exercises rejection   (it checks that the emitted tokens follow p exactly)
"""
from __future__ import annotations

import torch


def accept_or_resample(p: torch.Tensor, q: torch.Tensor | None, token: int, u: float) -> torch.Tensor | None:
    raise NotImplementedError("exercise 05: accept_or_resample (exercises/ex05_rejection.py)")
