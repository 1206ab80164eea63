"""The Medusa proposer: the target's own last hidden state, through K trained heads, guesses the next K tokens.

    LLM(speculative={"method": "medusa", "num_tokens": 3})   # the default model's shipped heads
    LLM(model, speculative={"method": "medusa", "heads": "my_heads.safetensors"})

No second model and no second KV pool. After each step the engine hands the
proposer the final hidden state of the row that chose each sequence's newest
token (`observe`); the next step's proposal runs the heads on it and the
target's LM head on their outputs (one batched matmul for all heads and
sequences) and takes each head's top-1: a chain of guesses for the tokens after
the newest one. The guesses are deterministic, so verification treats q as
one-hot and stays exact for sampled requests too (spec_decode/rejection.py).

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

# heads shipped with minillm, by the base model they were trained on (the metadata says how)
SHIPPED_HEADS = {"default": "smollm2-135m-instruct.medusa.safetensors"}


def shipped_heads_path(name: str = "default") -> Path:
    return Path(str(resources.files("minillm.spec_decode") / "heads" / SHIPPED_HEADS[name]))


def embedding_fingerprint(model) -> str:
    """A cheap identity of the base model the heads belong to: shape and a checksum of its embedding."""
    w = model.embed_tokens.weight
    return f"{tuple(w.shape)}:{float(w.detach().float()[:256].double().sum()):.4f}"


class MedusaProposer(Proposer):
    def __init__(self, runner, heads: MedusaHeads) -> None:
        model = runner.model
        self.runner = runner
        self.heads = heads.to(device=runner.device, dtype=model.embed_tokens.weight.dtype).eval()
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
            # the row that scored the newest token: after the accepted drafts, the target's own
            self.hidden[c.seq.seq_id] = (c.seq.num_tokens, hidden[first + picked.num_accepted].clone())

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
        x = self.heads(h)  # [K, rows, hidden]
        K = x.shape[0]
        logits = self.runner.model.compute_logits(x.reshape(K * len(ready), -1))
        guesses = logits.argmax(-1).reshape(K, len(ready)).t().tolist()
        for j, i in enumerate(ready):
            out[i].token_ids = guesses[j][: wants[i][1]]
        return out
