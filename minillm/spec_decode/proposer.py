"""A proposer guesses the next tokens of each decoding sequence; the step's batch carries them.

    proposer.propose(batch)   # fills chunk.draft_token_ids (and draft_probs) where chunk.num_lookahead > 0

The scheduler reserved `num_lookahead` budget and KV slots per decoding
sequence (never more than its context and max_tokens allow). The engine then
packs drafts into the same StepBatch as everything else, the target scores
them in one forward, and engine/token_choice.py verifies them.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from minillm.engine.batch import ScheduledBatch
from minillm.engine.sequence import Sequence
from minillm.spec_decode.proposal import Proposal
from minillm.spec_decode.speculative_config import SpeculativeConfig


class Proposer(ABC):
    def propose(self, batch: ScheduledBatch) -> None:
        wants = [c for c in batch.chunks if c.num_lookahead > 0]
        if not wants:
            return
        for c, prop in zip(wants, self.propose_tokens([(c.seq, c.num_lookahead) for c in wants])):
            c.draft_token_ids = prop.token_ids
            c.draft_probs = prop.q()

    @abstractmethod
    def propose_tokens(self, wants: list[tuple[Sequence, int]]) -> list[Proposal]:
        """Up to k tokens per (sequence, k); a proposal may be shorter, or empty."""


def make_proposer(cfg: SpeculativeConfig, runner) -> Proposer:
    """runner: the target's ModelRunner (a draft model reads and writes the target's KV pool)."""
    if cfg.method == "ngram":
        from minillm.spec_decode.ngram import NgramProposer

        return NgramProposer(cfg.ngram_max, cfg.ngram_min)
    from minillm.spec_decode.draft import DraftProposer, quantized_copy

    target = runner.model
    n = target.config.num_hidden_layers
    cfg.validate(n)
    draft = target if cfg.model == "self" else quantized_copy(target, cfg.model)
    return DraftProposer(runner, draft, tuple(range(cfg.num_layers or n)))
