"""The Medusa proposer: the target's own last hidden state, through K trained heads, guesses the next K tokens.

    LLM(speculative={"method": "medusa", "num_tokens": 3})   # the default model's shipped heads
    LLM(model, speculative={"method": "medusa", "heads": "my_heads.safetensors"})
    LLM(speculative={"method": "medusa", "tree": [3, 2, 1]})   # 15 candidates in a tree

No second model and no second KV pool. After each step the engine hands the
proposer the final hidden state of the row that chose each sequence's newest
token (`observe`); the next step's proposal runs the heads on it and the
target's LM head on their outputs (one batched matmul for all heads and
sequences) and takes each head's top-1: a chain of guesses for the tokens after
the newest one. With `tree` (e.g. [3, 2, 1]) each head ranks its top-k and the
guesses form a tree the target verifies in the same one forward (spec_decode/tree.py);
the chain is that tree with width 1. The guesses are deterministic, so verification
treats q as one-hot and stays exact for sampled requests too (spec_decode/rejection.py).

Trained by `minillm train-medusa` (spec_decode/medusa_train.py).
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch

from minillm.engine.sequence import Sequence
from minillm.spec_decode.medusa_heads import MedusaHeads
from minillm.spec_decode.proposal import Proposal
from minillm.spec_decode.proposer import Proposer
from minillm.spec_decode.tree import TreeTemplate

# heads shipped with minillm, by the base model they were trained on (the metadata says how)
SHIPPED_HEADS = {"default": "smollm2-135m-instruct.medusa.safetensors"}


def shipped_heads_path(name: str = "default") -> Path:
    return Path(str(resources.files("minillm.spec_decode") / "heads" / SHIPPED_HEADS[name]))


def embedding_fingerprint(model) -> str:
    """A cheap identity of the base model the heads belong to: shape and a checksum of its embedding."""
    w = model.embed_tokens.weight
    return f"{tuple(w.shape)}:{float(w.detach().float()[:256].double().sum()):.4f}"


class MedusaProposer(Proposer):
    def __init__(self, runner, heads: MedusaHeads, tree: TreeTemplate | None = None,
                 lm_head: torch.nn.Module | None = None) -> None:
        """lm_head: what ranks the heads' guesses (default: the target's own LM head). A RestrictedLMHead
        (draft_vocab) reads fewer rows; the target verifies every guess, so the output is unchanged."""
        model = runner.model
        self.lm_head = lm_head
        self.runner = runner
        self.heads = heads.to(device=runner.device, dtype=model.embed_tokens.weight.dtype).eval()
        # no tree: a chain of every head's top-1, of which a step takes its first k nodes
        self.tree = tree or TreeTemplate.from_spec([1] * heads.num_heads)
        self.topk = self.tree.topk_per_head()
        self.hidden: dict[int, tuple[int, torch.Tensor]] = {}  # seq_id -> (its token count then, hidden row)

    def observe(self, batch, step, chosen, hidden: torch.Tensor | None) -> None:
        if hidden is None:
            return
        for i, (c, picked) in enumerate(zip(batch.chunks, chosen)):
            if picked is None:
                continue
            if c.seq.is_finished:
                self.hidden.pop(c.seq.seq_id, None)
                continue
            first, _ = step.chunk_logits[i]
            # the row that scored the newest token: after the accepted drafts (a tree's: its last path node)
            row = picked.num_accepted
            if picked.accepted_nodes is not None:
                row = 1 + picked.accepted_nodes[-1] if picked.accepted_nodes else 0
            self.hidden[c.seq.seq_id] = (c.seq.num_tokens, hidden[first + row].clone())

    def release(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.hidden.pop(s.seq_id, None)

    @torch.inference_mode()
    def propose_tokens(self, wants: list[tuple[Sequence, int]]) -> list[Proposal]:
        out = [Proposal([], None) for _ in wants]
        ready = [i for i, (s, _) in enumerate(wants) if self.hidden.get(s.seq_id, (-1,))[0] == s.num_tokens]
        if not ready:
            return out  # e.g. a sequence recomputed after preemption: its next step brings a fresh hidden
        h = torch.stack([self.hidden[wants[i][0].seq_id][1] for i in ready])
        sizes = {i: min(wants[i][1], self.tree.num_nodes) for i in ready}  # a short budget takes a prefix
        depth = max(len(self.tree.paths[n - 1]) for n in sizes.values())  # nodes are listed by depth
        x = self.heads(h, depth)  # [depth, rows, hidden]: only the heads the proposal reads
        x = x.reshape(depth * len(ready), -1)
        logits = self.runner.model.compute_logits(x) if self.lm_head is None else self.lm_head(x).float()
        width = max(self.topk[:depth])
        if width == 1:
            ranked = logits.argmax(-1, keepdim=True)
        else:
            ranked = logits.topk(width, dim=-1).indices
        ranked = ranked.reshape(depth, len(ready), width).permute(1, 0, 2).tolist()  # [rows][head][rank]
        for j, i in enumerate(ready):
            n = sizes[i]
            out[i] = Proposal(self.tree.tokens(ranked[j], n), None, self.tree.parents(n))
        return out
