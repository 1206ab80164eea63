"""Turn a batch of logits into next tokens, each row with its own SamplingParams.

Greedy rows take the argmax. Other rows: divide by temperature, drop tokens
outside top-k, outside the top-p nucleus and below min-p * max probability,
then draw. A row with a seed draws from its own torch.Generator, so its output
does not depend on what else was batched with it.

Before any of that the engine may ban tokens per row (`ban_tokens`): until a
request has min_tokens output tokens, EOS and its stop_token_ids get -inf
(`min_tokens_bans` says which), so the model cannot end early.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from minillm.sampling_params import SamplingParams


# a fast path's argmax of float rows (FastPath.greedy), the same rule; None where it does not take them
Argmax = Callable[[torch.Tensor], "torch.Tensor | None"]


def greedy_tokens(logits: torch.Tensor, keepdim: bool = False, fast: Argmax | None = None) -> torch.Tensor:
    """The argmax along the last dimension: the first maximum, a NaN counting as the maximum.

    `max(-1).indices`, the same rule as argmax: torch 2.13's CPU argmax is a slower reduction.
    `fast`: an executor's own argmax (Executor.fast_argmax), tried first."""
    tokens = fast(logits) if fast is not None else None
    if tokens is not None:
        return tokens.unsqueeze(-1) if keepdim else tokens
    return logits.max(-1, keepdim=keepdim).indices


def top_tokens(logits: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, V] -> the `width` highest-scoring ids per row, best first [rows, width]; width 1 is
    greedy_tokens' first maximum."""
    return greedy_tokens(logits, keepdim=True) if width == 1 else logits.topk(width, dim=-1).indices


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]  # sampled token + top alternatives, when asked


def filter_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Apply temperature, top-k, top-p and min-p to [B, V] float logits (returns a new tensor)."""
    dev = logits.device
    temp = torch.tensor([p.temperature for p in params], device=dev, dtype=logits.dtype)
    logits = logits / temp[:, None]
    vocab = logits.shape[-1]
    top_k = [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params]  # past the vocabulary: off
    top_p = [p.top_p for p in params]
    min_p = [p.min_p for p in params]
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p) or any(m > 0 for m in min_p):
        logits = top_p_min_p_filter(logits, torch.tensor(top_p, device=dev, dtype=logits.dtype),
                                    torch.tensor(min_p, device=dev, dtype=logits.dtype),
                                    torch.tensor(top_k, device=dev))
    return logits


def top_p_min_p_filter(logits: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                       top_k: torch.Tensor | None = None) -> torch.Tensor:
    """[B, V] logits -> the same logits with every dropped token at -inf, per row:

    keep the top_k[i] largest (top_k >= V: off), then the smallest prefix of them, most likely
    first, whose probability reaches top_p[i] (the token crossing it stays; the first always does),
    then drop tokens whose probability is below min_p[i] * the largest. filter_logits calls this
    module name, so minillm.exercises.use("learner") runs exercises/ex03_sampling.py instead.
    """
    vocab = logits.shape[-1]
    if top_k is None:
        top_k = torch.full((logits.shape[0],), vocab, device=logits.device)
    if bool((top_k < vocab).any()) or bool((top_p < 1.0).any()):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device)[None, :]
        drop = ranks >= top_k[:, None]
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it stays)
        mass_before = probs.cumsum(-1) - probs
        # top_p == 1 means off: float32 cumsums reach 1.0 before the tail ends, which would drop
        # tokens of a row that asked for none (it shares this pass when another row filters)
        drop |= (mass_before >= top_p.to(probs.dtype)[:, None]) & (top_p < 1.0)[:, None]
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    if bool((min_p > 0).any()):
        probs = logits.softmax(-1)
        floor = probs.max(-1, keepdim=True).values * min_p.to(probs.dtype)[:, None]
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def min_tokens_bans(params: SamplingParams, num_output_tokens: int, eos_token_ids: set[int]) -> list[int]:
    """Token ids the NEXT token must not be, given that `num_output_tokens` are already out.

    Until the output holds `min_tokens` tokens, the tokens that would end it are masked
    out of the logits: the EOS ids (unless ignore_eos: then EOS does not end anything)
    and the request's stop_token_ids. This is what makes min_tokens real; checking
    stop conditions later would let the model "say" EOS and carry on after it.
    """
    if num_output_tokens >= params.min_tokens:
        return []
    ids = [] if params.ignore_eos else sorted(eos_token_ids)
    return list(dict.fromkeys(ids + list(params.stop_token_ids)))


def ban_tokens(logits: torch.Tensor, banned: list[list[int]]) -> torch.Tensor:
    """Set logits[i, banned[i]] = -inf in place for each row i of [B, V] logits; returns logits.

    Ids outside [0, V) are skipped (a user's stop_token_ids may name ids the model
    does not have). All lists empty, the usual case, costs no tensor op at all.
    """
    if not any(banned):
        return logits
    vocab = logits.shape[-1]
    rows = [i for i, ids in enumerate(banned) for t in ids if 0 <= t < vocab]
    cols = [t for ids in banned for t in ids if 0 <= t < vocab]
    if rows:
        idx = (torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device))
        logits.index_put_(idx, torch.tensor(float("-inf"), device=logits.device, dtype=logits.dtype))
    return logits


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
    fast_argmax: Argmax | None = None,
) -> SampleResult:
    """logits: [B, V] float32. Returns one token per row."""
    b = logits.shape[0]
    tokens = greedy_tokens(logits, fast=fast_argmax)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        idx = torch.tensor(rows, device=logits.device)
        probs = filter_logits(logits[idx], [params[i] for i in rows]).softmax(-1)
        # Exponential race: argmax(p / E) with E ~ Exp(1) draws exactly from p.
        noise = torch.empty_like(probs)
        for j, i in enumerate(rows):
            noise[j].exponential_(generator=generators[i])
        tokens[idx] = greedy_tokens(probs / noise, fast=fast_argmax)
    token_list = tokens.tolist()
    logprobs: list[dict[int, float] | None] = [None] * b
    want = [i for i, p in enumerate(params) if p.logprobs is not None]
    if want:
        lp = logits[want].log_softmax(-1)
        for j, i in enumerate(want):
            logprobs[i] = logprob_entry(lp[j], token_list[i], params[i].logprobs)
    return SampleResult(token_list, logprobs)


def logprob_entry(lp_row: torch.Tensor, token: int, k: int) -> dict[int, float]:
    """The chosen token's logprob plus the k most likely alternatives."""
    entry = {token: float(lp_row[token])}
    if k:
        vals, ids = lp_row.topk(k)
        for v, t in zip(vals.tolist(), ids.tolist()):
            entry.setdefault(t, v)
    return entry
