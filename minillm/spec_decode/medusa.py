"""The Medusa proposer: the target's own last hidden state, through K trained heads, guesses the next K tokens.

    LLM(speculative={"method": "medusa", "num_tokens": 3})   # the default model's shipped heads
    LLM(model, speculative={"method": "medusa", "heads": "my_heads.safetensors"})
    LLM(speculative={"method": "medusa", "tree": [3, 2, 1]})   # 15 candidates in a tree

No second model and no second KV pool. Each step, the heads run on the final
hidden state of every logit row, and their outputs join those rows in the
target's LM-head product (`ModelRunner.logit_extras`): at a few rows one pass
over the head's weights serves both. Which row's guesses count is known only
after verification, so the engine then hands the proposer the rows that chose
each sequence's newest token (`observe`), and the next proposal takes each
head's top-1 from there: a chain of guesses for the tokens after the newest
one. When sharing the pass would take as many passes over the head's weights as
two products (many rows: k >= 2 on the CPU, a large batch), the step keeps only
the hidden states and the proposal runs the heads and the LM head on them.

With `tree` (e.g. [3, 2, 1]) each head ranks its top-k and the guesses form a
tree the target verifies in the same one forward (spec_decode/tree.py); the
chain is that tree with width 1. The guesses are deterministic, so verification
treats q as one-hot and stays exact for sampled requests too (spec_decode/rejection.py).

Trained by `minillm train-medusa` (spec_decode/medusa_train.py).
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch

from minillm.engine.sampler import top_tokens
from minillm.engine.sequence import Sequence
from minillm.cpu.skinny_linear import SkinnyLinear, use_skinny_linears
from minillm.spec_decode.medusa_heads import MedusaHeads
from minillm.spec_decode.proposal import Proposal
from minillm.spec_decode.proposer import Proposer
from minillm.spec_decode.tree import TreeTemplate, chain_parents

# rows a product over the LM head can take for about the cost of one pass over its weights, by device:
# the CPU few-row kernel's 16-row products cost 2.2 one-row products here (minillm/cpu/skinny_linear.py)
ROWS_PER_WEIGHT_READ = {"cpu": 8, "cuda": 64}
# heads shipped with minillm, by the base model they were trained on (the metadata says how)
SHIPPED_HEADS = {"medusa": "smollm2-135m-instruct.medusa.safetensors",
                 "hydra": "smollm2-135m-instruct.hydra.safetensors"}


def shipped_heads_path(kind: str = "medusa") -> Path:
    """The heads of this kind shipped for the default model."""
    return Path(str(resources.files("minillm.spec_decode") / "heads" / SHIPPED_HEADS[kind]))


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
        if any(isinstance(m, SkinnyLinear) for m in model.modules()):  # the target's few-row products: the heads' too
            use_skinny_linears(self.heads)
        # no tree: a chain of every head's top-1, of which a step takes its first k nodes
        self.tree = tree or TreeTemplate.from_spec([1] * heads.num_heads)
        self.topk = self.tree.topk_per_head()
        self.hidden: dict[int, tuple[int, torch.Tensor]] = {}  # seq_id -> (its token count then, hidden row)
        # seq_id -> (its token count then, [head][rank] tokens): guesses ranked in the step's own LM-head pass
        self.ranked: dict[int, tuple[int, list[list[int]]]] = {}
        self.depth = len(self.tree.paths[-1])  # heads a proposal reads at most (set_lookahead)
        self.rows_per_read = ROWS_PER_WEIGHT_READ.get(runner.device.type, 1)
        if lm_head is None:  # a cut head (draft_vocab) is cheaper on its own
            runner.logit_extras = self.extra_rows

    def parents(self, n: int) -> list[int] | None:
        """The first n nodes' parents; None where they form a chain, which verifies as one: causal rows that
        the CPU's paged-decode kernel takes as decode rows (a tree needs a mask, and the masked path)."""
        parents = self.tree.parents(n)
        return None if parents == chain_parents(n) else parents

    def check_num_tokens(self, k: int) -> None:
        if k > self.heads.num_heads:  # a chain's guess i comes from head i
            raise ValueError(f"invalid speculative config: num_tokens ({k}) exceeds the "
                             f"{self.heads.num_heads} {self.heads.kind.capitalize()} heads")

    def set_lookahead(self, num_slots: int) -> None:
        self.depth = len(self.tree.paths[min(num_slots, self.tree.num_nodes) - 1])

    def extra_rows(self, h: torch.Tensor) -> torch.Tensor | None:
        """The heads' outputs for every logit row, to share the step's LM-head pass, when that takes fewer
        passes over the head's weights than two products would: which row's guesses the next step needs
        is known only after verification, so every row gets them (Medusa's paper does the same)."""
        rows = h.shape[0]
        if self.weight_passes(rows * (1 + self.depth)) >= self.weight_passes(rows) + self.weight_passes(self.depth):
            return None
        return self.heads(h.to(self.heads.heads[0].linear.weight.dtype), self.depth).reshape(self.depth * rows, -1)

    def weight_passes(self, rows: int) -> int:
        """Passes over the LM head's weights that a product over `rows` rows costs."""
        return -(-rows // self.rows_per_read)

    def head_top_tokens(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """The heads' states [rows, hidden] -> their `width` best tokens [rows, width], ranked on the
        target's LM head, or on the cut one's kept rows alone (draft_vocab)."""
        if self.lm_head is None:
            return top_tokens(self.runner.model.compute_logits(x), width)
        return self.lm_head.top_tokens(x, width)

    def width(self, depth: int) -> int:
        """Candidates each head ranks: the most that any of the first `depth` heads must rank."""
        return max(self.topk[:depth])

    def rank(self, top: torch.Tensor, depth: int, rows: int) -> list[list[list[int]]]:
        """Ranked tokens [depth * rows, width] (head-major) -> [row][head][rank] candidate tokens."""
        return top.reshape(depth, rows, top.shape[-1]).permute(1, 0, 2).tolist()

    def observe(self, batch, step, chosen, hidden: torch.Tensor | None) -> None:
        if hidden is None:
            return
        extra = self.runner.last_extra_logits  # this step's extra_rows through the LM head, or None
        ranked = None
        if extra is not None:
            depth = extra.shape[0] // hidden.shape[0]
            ranked = self.rank(top_tokens(extra, self.width(depth)), depth, hidden.shape[0])
        for i, (c, picked) in enumerate(zip(batch.chunks, chosen)):
            if picked is None:
                continue
            if c.seq.is_finished:
                self.release([c.seq])
                continue
            first, _ = step.chunk_logits[i]
            # the row that scored the newest token: after the accepted drafts (a tree's: its last path node)
            row = picked.num_accepted
            if picked.accepted_nodes is not None:
                row = 1 + picked.accepted_nodes[-1] if picked.accepted_nodes else 0
            self.hidden[c.seq.seq_id] = (c.seq.num_tokens, hidden[first + row].clone())
            if ranked is not None:
                self.ranked[c.seq.seq_id] = (c.seq.num_tokens, ranked[first + row])
            else:
                self.ranked.pop(c.seq.seq_id, None)

    def release(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.hidden.pop(s.seq_id, None)
            self.ranked.pop(s.seq_id, None)

    def proposal_sizes(self, wants: list[tuple[Sequence, int]]) -> dict[int, int]:
        """want index -> nodes to propose, for the sequences whose kept hidden state is their newest token's
        (not e.g. one recomputed after preemption: its next step brings a fresh one); a short budget
        takes a prefix of the tree."""
        return {i: min(k, self.tree.num_nodes) for i, (s, k) in enumerate(wants)
                if self.hidden.get(s.seq_id, (-1,))[0] == s.num_tokens}

    @torch.inference_mode()
    def propose_tokens(self, wants: list[tuple[Sequence, int]]) -> list[Proposal]:
        out = [Proposal([], None) for _ in wants]
        sizes = self.proposal_sizes(wants)
        if sizes:
            self.guess(wants, sizes, out)
        return out

    def guess(self, wants: list[tuple[Sequence, int]], sizes: dict[int, int], out: list[Proposal]) -> None:
        """out[i] = the proposal of sizes[i] nodes, for every want index i in sizes."""
        ready = list(sizes)
        depths = {i: len(self.tree.paths[n - 1]) for i, n in sizes.items()}  # nodes are listed by depth
        unranked = []
        for i in ready:  # guesses the verify step already ranked (extra_rows): no LM-head pass
            s = wants[i][0]
            have = self.ranked.get(s.seq_id)
            if have is not None and have[0] == s.num_tokens and len(have[1]) >= depths[i]:
                out[i] = Proposal(self.tree.tokens(have[1], sizes[i]), None, self.parents(sizes[i]))
            else:
                unranked.append(i)
        if not unranked:
            return
        ready, depth = unranked, max(depths[i] for i in unranked)
        h = torch.stack([self.hidden[wants[i][0].seq_id][1] for i in ready])
        x = self.heads(h, depth)  # [depth, rows, hidden]: only the heads the proposal reads
        x = x.reshape(depth * len(ready), -1)
        ranked = self.rank(self.head_top_tokens(x, self.width(depth)), depth, len(ready))
        for j, i in enumerate(ready):
            n = sizes[i]
            out[i] = Proposal(self.tree.tokens(ranked[j], n), None, self.parents(n))
