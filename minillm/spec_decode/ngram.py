"""Prompt lookup: propose what followed the latest earlier occurrence of the sequence's last n tokens.

Free to run (no model), and good exactly where outputs copy their input:
summaries quoting the text, code edits, extraction. q is deterministic, so
rejection sampling treats it as one-hot on the proposed token.
"""
from __future__ import annotations

from dataclasses import dataclass

from minillm.engine.sequence import Sequence
from minillm.spec_decode.proposal import Proposal
from minillm.spec_decode.proposer import Proposer


@dataclass
class NgramProposer(Proposer):
    ngram_max: int = 4
    ngram_min: int = 1

    def propose_one(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens; the longest matching suffix wins, its most recent match first."""
        n_tok = len(tokens)
        if k < 1:
            return []
        for n in range(min(self.ngram_max, n_tok - 1), self.ngram_min - 1, -1):
            suffix = tokens[n_tok - n :]
            # search right to left, excluding the suffix itself
            last = suffix[-1]
            for start in range(n_tok - n - 1, -1, -1):
                if tokens[start + n - 1] == last and tokens[start : start + n] == suffix:
                    cont = tokens[start + n : start + n + k]
                    if cont:
                        return cont
        return []

    def propose_tokens(self, wants: list[tuple[Sequence, int]]) -> list[Proposal]:
        return [Proposal(self.propose_one(s.token_ids, k)) for s, k in wants]
