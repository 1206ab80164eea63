"""A proposer guesses the next tokens of each decoding sequence; the step's batch carries them.

    proposer.propose(batch)   # fills chunk.draft_token_ids (draft_probs, draft_parents) where chunk.num_lookahead > 0

The scheduler reserved `num_lookahead` budget and KV slots per decoding
sequence (never more than its context and max_tokens allow). The engine then
packs drafts into the same StepBatch as everything else, the target scores
them in one forward, and engine/token_choice.py verifies them. factory.py builds
the proposer a SpeculativeConfig asks for.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from minillm.engine.batch import ScheduledBatch
from minillm.engine.sequence import Sequence
from minillm.spec_decode.proposal import Proposal


class Proposer(ABC):
    def propose(self, batch: ScheduledBatch) -> None:
        wants = [c for c in batch.chunks if c.num_lookahead > 0]
        if not wants:
            return
        for c, prop in zip(wants, self.propose_tokens([(c.seq, c.num_lookahead) for c in wants])):
            c.draft_token_ids = prop.token_ids
            c.draft_probs = prop.q()
            c.draft_parents = prop.parents if prop.token_ids else None

    def release(self, seqs: list[Sequence]) -> None:
        """Finished or aborted sequences: drop whatever the proposer keeps for them (a draft's blocks)."""

    def observe(self, batch, step, chosen, hidden) -> None:
        """After a step: the final hidden states of the logit rows (Medusa's heads read them)."""

    def check_num_tokens(self, k: int) -> None:
        """Raise if this proposer cannot guess k tokens a step (Medusa's heads: one per guess)."""

    def set_lookahead(self, num_slots: int) -> None:
        """The most tokens a proposal may hold from now on (the engine's k; a tree's node count)."""

    def trace_record(self):
        """The proposer's own state for the step trace (a separate draft's pool), or None."""
        return None

    @abstractmethod
    def propose_tokens(self, wants: list[tuple[Sequence, int]]) -> list[Proposal]:
        """Up to k tokens per (sequence, k); a proposal may be shorter, or empty."""
