"""The routing view: how many tokens each expert of each MoE layer received, from the step trace.

    view = routing_view(trace)               # the whole run so far
    view = routing_view(trace, step=5)       # steps 0..5
    view = routing_view(trace, 5, cumulative=False)   # step 5 alone
    view.counts[l][e], view.share(l), view.load_cv(l)

A pure function of StepTrace records (their moe_layers / expert_tokens, written by
the engine for mixture-of-experts models): no plotly, no engine. Load balance is
the coefficient of variation of a layer's counts (std / mean over its experts):
0 when every expert gets the same number of tokens, sqrt(E - 1) when one gets all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from minillm.engine.trace import StepTrace
from minillm.visualize.trace_index import clamp_step


def coefficient_of_variation(counts: Sequence[int]) -> float:
    """std / mean of the counts (population std); 0.0 for no tokens at all."""
    n = len(counts)
    mean = sum(counts) / n if n else 0.0
    if mean == 0:
        return 0.0
    return math.sqrt(sum((c - mean) ** 2 for c in counts) / n) / mean


@dataclass(frozen=True)
class RoutingView:
    first_step: int
    last_step: int  # the counts sum steps first_step..last_step
    layers: tuple[int, ...]  # decoder layer index of each row
    counts: tuple[tuple[int, ...], ...]  # [row][expert]: (token, expert) assignments
    num_tokens: int  # tokens the steps ran (each sent to top_k experts per layer)

    @property
    def num_experts(self) -> int:
        return len(self.counts[0]) if self.counts else 0

    @property
    def top_k(self) -> int:
        """Experts per token, as the counts show it (every layer routes each token to the same number)."""
        return sum(self.counts[0]) // self.num_tokens if self.counts and self.num_tokens else 0

    def share(self, row: int) -> tuple[float, ...]:
        """Fraction of the row's assignments each expert got (sums to 1)."""
        total = sum(self.counts[row])
        return tuple(c / total if total else 0.0 for c in self.counts[row])

    def load_cv(self, row: int) -> float:
        return coefficient_of_variation(self.counts[row])


def routing_view(trace: Sequence[StepTrace], step: int | None = None, cumulative: bool = True) -> RoutingView | None:
    """Tokens per expert per MoE layer over steps 0..step (cumulative) or at `step` alone; None: a dense model."""
    last = clamp_step(trace, step)
    first = 0 if cumulative else last
    steps = [t for t in trace[first : last + 1] if t.expert_tokens]
    if not steps:  # a dense model's trace (every step of a MoE model carries counts, zeros included)
        return None
    layers = steps[0].moe_layers
    counts = [[0] * len(row) for row in steps[0].expert_tokens]
    for t in steps:
        if t.moe_layers != layers:
            raise ValueError(f"step {t.step} routes layers {t.moe_layers}, step {steps[0].step} {layers}: "
                             "one trace per model")
        for acc, row in zip(counts, t.expert_tokens):
            for e, c in enumerate(row):
                acc[e] += c
    return RoutingView(first, last, layers, tuple(tuple(r) for r in counts), sum(t.num_tokens for t in steps))
