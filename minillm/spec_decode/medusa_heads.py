"""Medusa-1 heads (Cai et al., 2024): K small heads on the target's last hidden state guess tokens t+2 .. t+K+1.

    heads = MedusaHeads(hidden_size, num_heads=3)
    logits = model.compute_logits(heads(h))       # [K, rows, vocab]: head i guesses the token i + 2 ahead

Each head is one residual block, h + SiLU(W h + b), followed by the *target's own*
LM head (frozen, shared), so a head adds hidden^2 weights, not hidden x vocab.
W starts at zero: an untrained head repeats the LM head's guess for t+1, and
training moves it to t+i+1. The base model stays frozen (Medusa-1).

Stored as safetensors: the weights, and metadata naming the base model (its
config's shape), the command that trained it and the loss curve. A file is read
back by hydra_heads.load_heads, which knows both kinds of heads.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn


def save_module(module: nn.Module, path: str | Path, metadata: dict[str, str]) -> None:
    """A small trained module's weights and string metadata as one safetensors file (heads, EAGLE's layer)."""
    from safetensors.torch import save_file

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}, str(path), metadata=metadata)


def read_module_file(path: str | Path, what: str, train_command: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, tensors) of a file save_module wrote, with clear errors for a missing or unreadable one."""
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} file not found: {p} (train one with `{train_command}`)")
    try:
        with safe_open(str(p), "pt") as f:
            return f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise ValueError(f"{p}: not a readable {what} file ({type(e).__name__}: {e})") from e


class ResBlock(nn.Module):
    """h + SiLU(W h + b), then layers - 1 more of the same (Hydra++'s deeper heads; one is Medusa's)."""

    def __init__(self, hidden: int, layers: int = 1) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # identity at the start: the head first copies the LM head's guess
        nn.init.zeros_(self.linear.bias)
        self.extra = deeper_layers(hidden, layers)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return run_layers(self.extra, h + nn.functional.silu(self.linear(h)))


def deeper_layers(hidden: int, layers: int) -> nn.ModuleList:
    """A head's layers after its first: residual SiLU blocks, each the identity at the start (an empty
    list for one layer, so one-layer files keep their tensor names)."""
    if layers < 1:
        raise ValueError(f"a head needs at least one layer, got {layers}")
    return nn.ModuleList(ResBlock(hidden) for _ in range(layers - 1))


def run_layers(extra: nn.ModuleList, z: torch.Tensor) -> torch.Tensor:
    for block in extra:
        z = block(z)
    return z


class MedusaHeads(nn.Module):
    kind = "medusa"  # the file's "kind" (hydra_heads.py: heads that also read the guessed tokens)
    block = ResBlock

    def __init__(self, hidden_size: int, num_heads: int = 3, layers: int = 1) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"Medusa needs at least one head, got {num_heads}")
        self.hidden_size = hidden_size
        self.layers = layers
        self.heads = nn.ModuleList(self.block(hidden_size, layers) for _ in range(num_heads))
        self.metadata: dict[str, str] = {}

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    def forward(self, h: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """h [rows, hidden] (the target's final-norm hidden states) -> [num_heads, rows, hidden]
        (the first num_heads heads; all by default)."""
        return torch.stack([head(h) for head in self.heads[:num_heads]])

    # ----- files ---------------------------------------------------------------------------
    def save(self, path: str | Path, **metadata) -> None:
        meta = {**self.metadata, **{k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}}
        meta.update(num_heads=str(self.num_heads), hidden_size=str(self.hidden_size), kind=self.kind,
                    head_layers=str(self.layers))
        save_module(self, path, meta)
