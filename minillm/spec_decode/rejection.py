"""Exact speculative sampling: keep the target's distribution whatever the proposer guessed.

For draft token x drawn from q, accept with probability min(1, p(x) / q(x)); at
the first rejection draw from max(p - q, 0) normalised and stop; if all k are
accepted draw a bonus token from the target's distribution after the last one.
Each emitted token is then distributed exactly as p (Leviathan et al. 2023,
Chen et al. 2023). p is what minillm.engine.sampler would sample from -- the
same temperature / top-k / top-p / min-p filter -- so a request's settings
mean the same with and without speculation. Greedy rows reduce to exact
match against the target's argmax.

A deterministic proposer (n-gram) has q one-hot on x: accept with p(x), and the
residual is p with x removed.
"""
from __future__ import annotations

import torch

from minillm.engine.sampler import filter_logits, greedy_tokens
from minillm.sampling_params import SamplingParams
from minillm.spec_decode.tree import children


def acceptance_probability(p_x: float, q_x: float) -> float:
    """min(1, p/q). Module-level so a test can break it on purpose and watch the chi-square fail."""
    return 1.0 if p_x >= q_x else p_x / q_x


def residual_distribution(p: torch.Tensor, q: torch.Tensor | None, x: int) -> torch.Tensor:
    """Where to draw after rejecting x: max(p - q, 0) normalised (q None: one-hot on x).

    Module-level, like acceptance_probability, so a test can break it on purpose.
    """
    if q is None:
        residual = p.clone()
        residual[x] = 0.0
    else:
        residual = (p - q).clamp_min(0.0)
    total = float(residual.sum())
    # p == q up to rounding leaves no mass: then p itself is the right fallback
    return residual / total if total > 0 else p


def accept_or_resample(p: torch.Tensor, q: torch.Tensor | None, token: int, u: float) -> torch.Tensor | None:
    """One draft token x = `token`, drawn from q (None: a deterministic proposer, q one-hot on x).

    u is a uniform draw in [0, 1). Returns None when x is accepted (u < min(1, p(x) / q(x))), else
    the distribution the replacement token is drawn from: max(p - q, 0) normalised. verify_tokens
    and verify_tree call this module name, so minillm.exercises.use("learner") runs
    exercises/ex05_rejection.py instead.
    """
    q_x = 1.0 if q is None else float(q[token])
    if u < acceptance_probability(float(p[token]), q_x):
        return None
    return residual_distribution(p, q, token)


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[rows, V] logits -> the sampler's distribution for each row (same filters as sample())."""
    return filter_logits(logits, [params] * logits.shape[0]).softmax(-1)


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def verify_tokens(
    logits: torch.Tensor,
    draft: list[int],
    draft_probs: torch.Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> tuple[list[int], int]:
    """logits: [len(draft) + 1, V] target logits, row j scoring the token after draft[:j].

    draft_probs: [len(draft), V] the q each draft token was drawn from, or None for a
    deterministic proposer. Returns (tokens to emit, number of draft tokens accepted);
    the emitted list is the accepted drafts plus one target token (correction or bonus).
    """
    d = len(draft)
    if params.greedy:
        target = greedy_tokens(logits).tolist()
        n = 0
        while n < d and draft[n] == target[n]:
            n += 1
        return draft[:n] + [target[n]], n
    p = target_probs(logits.float(), params)
    u = torch.rand(d, generator=generator, device=logits.device).tolist() if d else []
    for j, x in enumerate(draft):
        resample = accept_or_resample(p[j], None if draft_probs is None else draft_probs[j], x, u[j])
        if resample is None:
            continue
        return draft[:j] + [_draw(resample, generator)], j
    return list(draft) + [_draw(p[d], generator)], d


def verify_tree(
    logits: torch.Tensor,
    tokens: list[int],
    parents: list[int],
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> tuple[list[int], list[int]]:
    """Walk a tree of deterministic guesses from the root (spec_decode/tree.py).

    logits: [1 + N, V]; row 0 scores the token after the root, row 1 + j the token after node j.
    At each node the target's token is drawn from p; a child guessing it is accepted and the
    walk goes on from there. Sampled rows test the children one by one (SpecInfer's
    multi-candidate rule for one-hot q): accept child x with probability p'(x), else remove x
    from p' and renormalise; with every child rejected draw from what is left. Each emitted
    token is thereby drawn from p exactly. Returns (tokens to emit, accepted node indices).
    """
    kids = children(parents)
    probs = None if params.greedy else target_probs(logits.float(), params)
    path: list[int] = []
    node = -1
    while True:
        row = node + 1
        options = kids.get(node, [])
        if probs is None:
            want = int(greedy_tokens(logits[row]))
            nxt = next((c for c in options if tokens[c] == want), None)
            if nxt is None:
                return [tokens[c] for c in path] + [want], path
        else:
            p = probs[row]
            nxt = None
            for c in options:
                u = float(torch.rand((), generator=generator, device=p.device))
                resample = accept_or_resample(p, None, tokens[c], u)
                if resample is None:
                    nxt = c
                    break
                p = resample  # rejected: p without it, renormalised
            if nxt is None:
                return [tokens[c] for c in path] + [_draw(p, generator)], path
        path.append(nxt)
        node = nxt
