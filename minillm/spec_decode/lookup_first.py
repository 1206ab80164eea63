"""Prompt lookup first, the draft model where lookup finds nothing.

    LLM("qwen2.5-coder-1.5b", speculative={"method": "draft", "model": "qwen2.5-coder-0.5b",
                                           "num_tokens": 3, "prompt_lookup_min": 3})

Two proposers win on different text. Where the output copies its context (a
document quoted back, an edited function, a list repeated) the tokens that
followed the same few tokens earlier in the sequence are right most of the
time, and finding them costs nothing; a draft model spends k forwards to guess
the same thing. Where nothing repeats, lookup has nothing to say and the draft
model is the only guess worth verifying. So per sequence and step: a suffix of
at least `prompt_lookup_min` tokens seen before (ngram.py) proposes what
followed it; the other sequences go to the draft model, in one batch as usual.

The draft's K/V for a sequence simply falls behind while lookup proposes for
it: the next time the draft is asked, its catch-up forward covers every token
it has not cached (draft_model.py), as after a rejection. The step trace's
draft record lists the sequences lookup served (`lookup_seqs`).
"""
from __future__ import annotations

from dataclasses import replace

from minillm.engine.sequence import Sequence
from minillm.spec_decode.draft_model import DraftModelProposer
from minillm.spec_decode.ngram import NgramProposer
from minillm.spec_decode.proposal import Proposal
from minillm.spec_decode.proposer import Proposer


class LookupFirstProposer(Proposer):
    def __init__(self, lookup: NgramProposer, draft: DraftModelProposer) -> None:
        self.lookup = lookup
        self.draft = draft
        self._served: list[int] = []  # seq ids lookup proposed for since the last trace record

    def propose_tokens(self, wants: list[tuple[Sequence, int]]) -> list[Proposal]:
        out = self.lookup.propose_tokens(wants)
        rest = [i for i, p in enumerate(out) if not p.token_ids]
        self._served.extend(wants[i][0].seq_id for i, p in enumerate(out) if p.token_ids)
        if rest:
            for i, prop in zip(rest, self.draft.propose_tokens([wants[i] for i in rest])):
                out[i] = prop
        return out

    # the draft keeps per-sequence state and a pool of its own: everything else is its business
    def release(self, seqs: list[Sequence]) -> None:
        self.draft.release(seqs)

    def set_lookahead(self, num_slots: int) -> None:
        self.draft.set_lookahead(num_slots)

    def check_num_tokens(self, k: int) -> None:
        self.draft.check_num_tokens(k)

    def trace_record(self):
        served, self._served = tuple(self._served), []
        return replace(self.draft.trace_record(), lookup_seqs=served)
