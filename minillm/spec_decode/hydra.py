"""The Hydra proposer: Medusa's, with heads that read the guesses before them (hydra_heads.py).

    LLM(speculative={"method": "hydra", "num_tokens": 1})                   # the default model's shipped heads
    LLM(speculative={"method": "hydra", "num_tokens": 1, "draft_vocab": 8192})   # rank on a cut LM head
    LLM(speculative={"method": "hydra", "tree": [2, 1]})

Like Medusa it keeps, after each step, the final hidden state of the row that
chose each sequence's newest token (MedusaProposer.observe). A proposal then
walks the tree depth by depth: at depth 1 every sequence's head 1 reads that
hidden state and the newest token; at depth d, head d reads each parent node's
state and the parent's own token, so the children of two different parents are
different guesses (Medusa's heads guess the same tokens under every parent).
One LM-head product per depth ranks the guesses of all sequences at once.
"""
from __future__ import annotations

import torch

from minillm.engine.sequence import Sequence
from minillm.spec_decode.hydra_heads import HydraHeads
from minillm.spec_decode.medusa import MedusaProposer
from minillm.spec_decode.proposal import Proposal
from minillm.spec_decode.tree import TreeTemplate


class HydraProposer(MedusaProposer):
    def __init__(self, runner, heads: HydraHeads, tree: TreeTemplate | None = None,
                 lm_head: torch.nn.Module | None = None) -> None:
        if not isinstance(heads, HydraHeads):
            raise ValueError(f"method 'hydra' needs Hydra heads (train-medusa --kind hydra), got {heads.kind} heads")
        super().__init__(runner, heads, tree, lm_head)
        runner.logit_extras = None  # the heads need the step's chosen token first: no shared pass

    def guess(self, wants: list[tuple[Sequence, int]], sizes: dict[int, int], out: list[Proposal]) -> None:
        ready = list(sizes)
        embed = self.runner.model.embed_tokens
        dtype = self.heads.heads[0].linear.weight.dtype
        # per sequence: rank path -> (the state the path's last head produced, the path's token); () is the root
        nodes = {i: {(): (self.hidden[wants[i][0].seq_id][1], wants[i][0].token_ids[-1])} for i in ready}
        for d in range(1, max(len(self.tree.paths[n - 1]) for n in sizes.values()) + 1):
            # the parents whose children at depth d are in some sequence's first n nodes
            jobs = list(dict.fromkeys((i, p[:-1]) for i in ready for p in self.tree.paths[:sizes[i]] if len(p) == d))
            if not jobs:
                break
            z = torch.stack([nodes[i][parent][0] for i, parent in jobs]).to(dtype)
            tokens = torch.tensor([nodes[i][parent][1] for i, parent in jobs], device=z.device)
            z = self.heads.step(d - 1, z, embed(tokens).to(dtype))
            ranked = self.rank(self.head_top_tokens(z, self.topk[d - 1]), 1, len(jobs))  # [row][one head][rank]
            for row, (i, parent) in enumerate(jobs):
                for rank, token in enumerate(ranked[row][0]):
                    nodes[i][parent + (rank,)] = (z[row], token)
        for i in ready:
            n = sizes[i]
            out[i] = Proposal([nodes[i][p][1] for p in self.tree.paths[:n]], None, self.parents(n))
