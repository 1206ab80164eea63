"""Hydra heads (Ankner et al., 2024): Medusa heads that also read the tokens guessed before them.

    z_0 = h_t                                       the target's final hidden state; it chose x_{t+1}
    z_i = z_{i-1} + SiLU(W_i [z_{i-1}; norm(e(x_{t+i}))] + b_i)
    head i's guess for x_{t+i+1} = argmax LM_head(z_i)

A Medusa head must guess x_{t+2} without knowing x_{t+1}, the token the target
is choosing in the same step: it bets on one of the likely x_{t+1} at once. A
Hydra head is handed x_{t+1}'s embedding (the target's own, frozen) and guesses
only what follows it: the default model's shipped head 1 is right 0.27 of the
time on the chat benchmark's answers instead of Medusa's 0.14 (`minillm bench
spec --proposers none,medusa,hydra`; the held-out figures are in the file's metadata). The price is order: the
heads run one after another, each after the previous guess is known, so their
guesses cannot share the verify step's LM-head pass (medusa.py) and each depth
takes a pass of its own (a cut head, draft_vocab, makes it small).

Training is Medusa's (medusa_train.py), teacher-forced: head i reads the true
x_{t+i}, which is what it sees at inference whenever heads 1..i-1 were right,
the only case in which its guess can be accepted.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from minillm.models.layers import RMSNorm
from minillm.spec_decode.medusa_heads import MedusaHeads, deeper_layers, read_module_file, run_layers


class HydraBlock(nn.Module):
    """z + SiLU(W [z; norm(e)] + b), then layers - 1 residual SiLU blocks on z alone (Hydra++'s deeper heads)."""

    def __init__(self, hidden: int, layers: int = 1) -> None:
        super().__init__()
        # the embedding table's rows are not on the hidden state's scale (and Gemma's are scaled up): normalise them.
        # The model's RMSNorm with nn.RMSNorm's default eps (float32's): the same parameter and the same
        # values, one C++ pass in eager float32 inference instead of PyTorch's chain of small ops
        self.token_norm = RMSNorm(hidden, eps=torch.finfo(torch.float32).eps)
        self.linear = nn.Linear(2 * hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # identity at the start, as a Medusa head
        nn.init.zeros_(self.linear.bias)
        self.extra = deeper_layers(hidden, layers)

    def forward(self, z: torch.Tensor, token_embedding: torch.Tensor) -> torch.Tensor:
        z = z + nn.functional.silu(self.linear(torch.cat([z, self.token_norm(token_embedding)], dim=-1)))
        return run_layers(self.extra, z)


class HydraHeads(MedusaHeads):
    kind = "hydra"
    block = HydraBlock

    def step(self, i: int, z: torch.Tensor, token_embedding: torch.Tensor) -> torch.Tensor:
        """Head i (0-based): the state after the previous head (h_t for head 0) and the embedding of the
        token it follows -> the state whose LM-head row guesses the next token."""
        return self.heads[i](z, token_embedding)

    def forward(self, h: torch.Tensor, token_embeddings: torch.Tensor) -> torch.Tensor:
        """Teacher-forced: h [rows, hidden], token_embeddings [K, rows, hidden] (x_{t+1} .. x_{t+K})
        -> [K, rows, hidden], head i's state for guessing x_{t+i+2}."""
        out, z = [], h
        for i in range(token_embeddings.shape[0]):
            z = self.step(i, z, token_embeddings[i])
            out.append(z)
        return torch.stack(out)


HEAD_KINDS = {"medusa": MedusaHeads, "hydra": HydraHeads}  # a heads file's "kind" -> the class that reads it


def load_heads(path: str | Path, hidden_size: int | None = None) -> MedusaHeads:
    """Medusa or Hydra heads, as the file's metadata says (files without a kind are Medusa's); the file
    MedusaHeads.save wrote. Here, where both kinds are known (medusa_heads.py knows only its own)."""
    p = Path(path)
    meta, tensors = read_module_file(p, "Medusa heads", "minillm train-medusa")
    n, h = int(meta.get("num_heads", 0)), int(meta.get("hidden_size", 0))
    if hidden_size is not None and h != hidden_size:
        raise ValueError(f"{p}: heads for hidden size {h}, the target's is {hidden_size} (another base model)")
    kind = meta.get("kind", "medusa")
    if kind not in HEAD_KINDS:
        raise ValueError(f"{p}: heads of kind {kind!r}; this minillm knows {sorted(HEAD_KINDS)}")
    heads = HEAD_KINDS[kind](h, n, int(meta.get("head_layers", 1)))
    try:
        heads.load_state_dict(tensors)
    except RuntimeError as e:
        raise ValueError(f"{p}: its tensors do not fit {kind} heads ({str(e)[:300]})") from e
    heads.metadata = dict(meta)
    return heads.eval()
