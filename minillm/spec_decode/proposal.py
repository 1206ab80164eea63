"""What a proposer hands the verifier for one sequence."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Proposal:
    token_ids: list[int]
    # per token the distribution it was drawn from (list of [V] rows), or None when the
    # proposer is deterministic (n-gram; greedy drafts): the verifier then treats q as one-hot
    probs: list[torch.Tensor] | None = None
    # a tree of guesses (spec_decode/tree.py): each token's parent (-1: the newest token); None: a chain
    parents: list[int] | None = None

    def q(self) -> torch.Tensor | None:
        return torch.stack(self.probs) if self.probs else None
