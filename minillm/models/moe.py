"""A sparse mixture-of-experts MLP: a router picks k of E expert MLPs per token.

    weights, experts = block.route(x)   # [T, k] weights (float32), [T, k] expert ids
    y = block(x)                        # sum_j weights[t, j] * expert_{experts[t, j]}(x[t])  (+ shared expert)

Routing, as transformers computes it (checked against modeling_mixtral.py and
modeling_qwen2_moe.py, v5):

    p = softmax(router(x))                    # in float32, over all E experts
    w, e = top_k(p)                           # the k most probable experts
    w = w / w.sum()  if norm_topk_prob        # Mixtral always; Qwen2-MoE as its config says

Qwen2-MoE adds a *shared* expert every token goes through, scaled by a gate of
its own: y += sigmoid(shared_gate(x)) * shared_expert(x).

Running the experts without a per-token Python loop: flatten the T x k
(token, expert) assignments, sort them by expert (a stable argsort, so each
expert's tokens keep their order), count them per expert (bincount); then every
expert runs once, on the contiguous run of its tokens, as two batched matmuls,
and its outputs are scaled by their weights and added back into the tokens'
rows (index_add_). The loop is over the E experts, not the T tokens; an expert
that got no token costs nothing. The counts are what the step trace records.

Expert parallelism (parallel/shard.py): a rank keeps experts [lo, hi) only and
skips the others' runs; the partial outputs of all ranks are summed by one
all-reduce (`reduce`). The router runs on every rank over all tokens, so every
rank routes alike and counts every expert's tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from minillm.config import ModelConfig
from minillm.models.layers import SwiGLU


class Experts(nn.Module):
    """E SwiGLU MLPs stored as two 3-D tensors (one slice per expert), as transformers >= 5 stores them.

    gate_up_proj[e]: [2 * I, H] (gate rows, then up rows); down_proj[e]: [H, I].
    One tensor per kind keeps loading and expert-parallel slicing a matter of indexing dim 0.
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Random, like transformers' init (a loader skips it: every weight comes from the file)."""
        nn.init.normal_(self.gate_up_proj, std=0.02)
        nn.init.normal_(self.down_proj, std=0.02)

    @property
    def num_experts(self) -> int:
        return self.gate_up_proj.shape[0]

    def run(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e (a local index) on its tokens x [n, H]: down(silu(gate(x)) * up(x))."""
        gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[e])


class SparseMoeBlock(nn.Module):
    """Router + experts (+ the optional shared expert): a drop-in for a decoder layer's dense MLP."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, e = cfg.hidden_size, cfg.num_experts
        self.num_experts = e
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.gate = nn.Linear(h, e, bias=False)  # the router: one logit per expert
        self.experts = Experts(e, h, cfg.moe_intermediate_size)
        shared = cfg.shared_expert_intermediate_size
        self.shared_expert = SwiGLU(h, shared) if shared else None
        self.shared_expert_gate = nn.Linear(h, 1, bias=False) if shared else None
        # expert parallelism: this rank holds experts [lo, hi); `reduce` sums the ranks' partial outputs
        self.expert_range = (0, e)
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
        # (token, expert) assignments per expert summed since the last take_routed_tokens(): the trace's counts
        self.register_buffer("routed_tokens", torch.zeros(e, dtype=torch.int64), persistent=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, expert ids [T, k]) for each token of x [T, H]."""
        probs = F.softmax(self.gate(x).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.route(x)
        flat = experts.reshape(-1)  # assignment a = t * k + j: token t's j-th choice
        counts = torch.bincount(flat, minlength=self.num_experts)
        self.routed_tokens += counts
        order = torch.argsort(flat, stable=True)  # assignments grouped by expert, tokens in order within each
        token_of = order // self.top_k
        weight_of = weights.reshape(-1)[order]
        ends = counts.cumsum(0).tolist()  # one host read per layer: where each expert's run ends
        out = torch.zeros_like(x)
        lo, hi = self.expert_range
        for e in range(lo, hi):
            start, end = (ends[e - 1] if e else 0), ends[e]
            if start == end:
                continue
            rows = token_of[start:end]
            y = self.experts.run(e - lo, x[rows])
            out.index_add_(0, rows, (y.float() * weight_of[start:end, None]).to(x.dtype))
        if self.shared_expert is not None:
            # expert parallel: each rank holds a column slice of the shared expert, so its share is partial too
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out if self.reduce is None else self.reduce(out)


def moe_blocks(model: nn.Module) -> list[SparseMoeBlock]:
    """The model's MoE layers in layer order (empty for a dense model)."""
    return [m for m in model.modules() if isinstance(m, SparseMoeBlock)]


@dataclass(frozen=True)
class RoutedTokens:
    """Tokens each expert received, per MoE layer: counts[l][e] (token, expert) assignments of layers[l].

    A step's counts sum to top_k x the step's tokens in every layer."""

    layers: tuple[int, ...]  # decoder layer indices of the MoE layers (Qwen2-MoE may keep dense ones)
    counts: tuple[tuple[int, ...], ...]


def reset_routed_tokens(blocks: list[SparseMoeBlock]) -> None:
    """Drop counts from forwards outside the engine's steps (a standalone forward, a warm-up)."""
    for b in blocks:
        b.routed_tokens.zero_()


def take_routed_tokens(model: nn.Module) -> RoutedTokens | None:
    """The counts since the last call (counters reset); one small int tensor per layer, read in one copy.

    None for a dense model."""
    layers = [(i, layer.mlp) for i, layer in enumerate(getattr(model, "layers", ()))
              if isinstance(getattr(layer, "mlp", None), SparseMoeBlock)]
    if not layers:
        return None
    counts = torch.stack([b.routed_tokens for _, b in layers])
    for _, b in layers:
        b.routed_tokens.zero_()
    return RoutedTokens(tuple(i for i, _ in layers), tuple(tuple(row) for row in counts.tolist()))
