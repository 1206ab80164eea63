"""The checks every implementation of an exercise must pass: the engine's own, the solutions, yours.

Each check takes the exercise's functions and raises (AssertionError with a message saying what is
wrong, or the stub's NotImplementedError) or returns None. Each compares against an independent
reference written here in the plainest way: the longest common prefix for the hash chain, a
hand-written table for admission, a float64 numpy sort-and-cumsum for sampling, torch.softmax on
the whole row for the online softmax, and the target distribution itself (exactly, then by a
chi-square test on samples) for the rejection rule.
"""
from __future__ import annotations

import random
from typing import Callable

import numpy as np
import torch


# ----- 01: the hash chain ---------------------------------------------------------------------
def check_block_hash(chain_block_hash: Callable, cached_prefix_blocks: Callable) -> None:
    h = chain_block_hash
    a = h(None, (1, 2, 3, 4))
    assert isinstance(a, bytes) and len(a) >= 16, f"return a cryptographic digest (bytes), got {type(a).__name__}"
    assert h(None, (1, 2, 3, 4)) == a, "not deterministic"
    assert h(None, [1, 2, 3, 4]) == a, "a list and a tuple of the same ids must hash alike"
    assert h(None, (1, 2, 3, 5)) != a, "changing a token must change the digest"
    b = h(a, (5, 6, 7, 8))
    assert b != h(None, (5, 6, 7, 8)), "the parent's digest must be part of the block's digest"
    assert b != h(h(None, (9, 2, 3, 4)), (5, 6, 7, 8)), "the same block after a different prefix must differ"
    assert h(h(None, (1, 2)), (3,)) != h(h(None, (1,)), (2, 3)), "splitting tokens differently must not collide"
    assert h(None, (1, 23)) != h(None, (12, 3)), "ids must not run together (12|3 vs 1|23)"
    rng = random.Random(0)
    seen = {h(None if i % 2 else a, tuple(rng.randrange(50) for _ in range(4))) for i in range(400)}
    assert len(seen) >= 390, "too many collisions among random blocks"  # a few exact repeats are expected

    # the walk, against the longest common prefix with what was registered
    bs = 4
    base = [rng.randrange(1000) for _ in range(41)]
    registered = [base, base[:20] + [7] * 12, [rng.randrange(1000) for _ in range(30)]]
    by_digest: dict[bytes, tuple[int, tuple[int, ...]]] = {}
    id_of_prefix: dict[tuple[int, ...], int] = {}  # the independent truth: block ids by whole prefix
    for prompt in registered:
        parent = None
        for i in range(len(prompt) // bs):
            tokens = tuple(prompt[i * bs : (i + 1) * bs])
            parent = h(parent, tokens)
            bid = id_of_prefix.setdefault(tuple(prompt[: (i + 1) * bs]), len(id_of_prefix))
            by_digest.setdefault(parent, (bid, tokens))

    calls: list[int] = []

    def lookup(digest: bytes, tokens: tuple[int, ...]) -> int | None:
        calls.append(1)
        hit = by_digest.get(digest)
        return hit[0] if hit is not None and hit[1] == tuple(tokens) else None

    queries = {
        "the same prompt": base,
        "a prompt of whole blocks, all cached": base[:40],
        "shares 18 tokens": base[:18] + [1] * 10,
        "shares 33 tokens, then goes on": base[:33] + [5] * 9,
        "the second registered prompt and more": base[:20] + [7] * 12 + [3, 3],
        "same blocks 2.. but a different first block": [999] + base[1:],
        "nothing in common": [rng.randrange(1000, 2000) for _ in range(25)],
        "shorter than a block": base[:3],
        "exactly one block": base[:4],
    }
    for name, q in queries.items():
        lcp = max(_common_prefix(q, p) for p in registered)
        n_hit = min(lcp // bs, (len(q) - 1) // bs)  # never the block holding the last token
        expect = [id_of_prefix[tuple(q[: (i + 1) * bs])] for i in range(n_hit)]
        calls.clear()
        got = cached_prefix_blocks(q, bs, h, lookup)
        assert list(got) == expect, f"{name}: expected blocks {expect}, got {list(got)}"
        assert len(calls) <= n_hit + 1, f"{name}: keep looking after the first miss? {len(calls)} lookups"


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# ----- 02: admission --------------------------------------------------------------------------
ADMISSION_TABLE = [  # (remaining, budget_left, seats_left, chunked) -> tokens, written out by hand
    ((10, 64, 1, True), 10), ((64, 64, 1, True), 64), ((65, 64, 1, True), 64), ((300, 61, 4, True), 61),
    ((10, 64, 1, False), 10), ((64, 64, 1, False), 64), ((65, 64, 1, False), 0), ((300, 61, 4, False), 0),
    ((10, 64, 0, True), 0), ((10, 0, 3, True), 0), ((1, 1, 1, False), 1), ((1, 0, 1, False), 0),
    ((5, -3, 2, True), 0), ((5, 7, -1, True), 0),
]


def check_admission(admit_within_budget: Callable) -> None:
    for args, want in ADMISSION_TABLE:
        got = admit_within_budget(*args)
        assert got == want, f"admit_within_budget{args} should be {want}, got {got}"
    for remaining in range(1, 20):
        for budget in range(0, 20):
            for chunked in (True, False):
                got = admit_within_budget(remaining, budget, 2, chunked)
                assert 0 <= got <= min(remaining, max(budget, 0)), f"{(remaining, budget, 2, chunked)} -> {got}"
                assert got == 0 or got == remaining or chunked, "without chunked prefill a prompt goes whole or not"


# ----- 03: sampling filters -------------------------------------------------------------------
def _kept_reference(x: np.ndarray, top_k: int, top_p: float, min_p: float) -> tuple[set[int], set[int]]:
    """float64, one row. Returns (kept ids, ids too close to a threshold to call in float32)."""
    order = np.argsort(-x, kind="stable")[:top_k]
    z = x[order] - x[order].max()
    p = np.exp(z) / np.exp(z).sum()
    before = np.cumsum(p) - p
    keep = (before < top_p) | (top_p >= 1.0)  # top_p 1.0 is "off", whatever the rounding of the cumsum
    keep[0] = True
    floor = min_p * p[0]
    keep &= p >= floor
    close = (np.abs(before - top_p) < 1e-4) | ((min_p > 0) & (np.abs(p - floor) < 1e-6 * max(p[0], 1e-30)))
    close[0] = False
    return {int(i) for i in order[keep]}, {int(i) for i in order[close]}


def check_sampling(top_p_min_p_filter: Callable) -> None:
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    b, vocab = 96, 50
    logits = torch.randn(b, vocab, generator=g) * torch.empty(b, 1).uniform_(0.3, 6.0, generator=g)
    top_k = torch.tensor([vocab if i % 3 else int(rng.integers(1, vocab)) for i in range(b)])
    top_p = torch.tensor([1.0 if i % 4 == 0 else float(rng.uniform(0.05, 0.99)) for i in range(b)])
    min_p = torch.tensor([0.0 if i % 2 else float(rng.uniform(0.0, 0.3)) for i in range(b)])
    # the edges, by hand: everything kept; only the argmax (top_p tiny, top_k 1, min_p 1)
    top_k[:4], top_p[:4], min_p[:4] = torch.tensor([vocab, vocab, 1, vocab]), torch.tensor([1.0, 1e-6, 1.0, 1.0]), \
        torch.tensor([0.0, 0.0, 0.0, 1.0])
    out = top_p_min_p_filter(logits.clone(), top_p.clone(), min_p.clone(), top_k.clone())
    assert tuple(out.shape) == (b, vocab), f"expected shape {(b, vocab)}, got {tuple(out.shape)}"
    checked = 0
    for i in range(b):
        want, close = _kept_reference(logits[i].double().numpy(), int(top_k[i]), float(top_p[i]), float(min_p[i]))
        want_clear = want - close
        kept = torch.isfinite(out[i])
        got = set(torch.nonzero(kept).flatten().tolist())
        assert torch.equal(out[i][kept], logits[i][kept]), f"row {i}: kept logits must be unchanged"
        assert bool((out[i][~kept] == float("-inf")).all()), f"row {i}: dropped tokens must be -inf"
        # a token within rounding of a threshold may go either way in float32; every other must match
        checked += len(close) == 0
        assert got - close == want_clear, (f"row {i} (top_k {int(top_k[i])}, top_p {float(top_p[i]):.3f}, "
                             f"min_p {float(min_p[i]):.3f}): kept {len(got)} tokens, expected {len(want)}; "
                             f"missing {sorted(want_clear - got)[:5]}, extra {sorted(got - close - want)[:5]}")
    assert checked >= b // 2, f"only {checked} of {b} rows had no token at a threshold"
    # a real vocabulary: a float32 cumsum reaches 1.0 long before the tail ends, and a row with
    # top_p 1.0 ("off") must still keep every token when its neighbour filters
    big = torch.randn(2, 49152, generator=g) * 8
    out = top_p_min_p_filter(big.clone(), torch.tensor([1.0, 0.9]), torch.zeros(2), torch.full((2,), 49152))
    assert bool(torch.isfinite(out[0]).all()), \
        f"top_p=1.0 must keep all 49152 tokens, kept {int(torch.isfinite(out[0]).sum())} (float32 cumsum reached 1.0)"


# ----- 04: online softmax ---------------------------------------------------------------------
def check_online_softmax(online_softmax_update: Callable) -> None:
    g = torch.Generator().manual_seed(0)
    for rows, keys, dim, tile, scale in [(5, 37, 8, 8, 1.0), (16, 64, 16, 16, 0.25), (7, 50, 4, 7, 40.0),
                                         (3, 9, 8, 32, 1.0)]:
        scores = torch.randn(2, rows, keys, generator=g) * scale  # scale 40: exp(score) overflows float32
        v = torch.randn(2, keys, dim, generator=g)
        visible = torch.rand(2, rows, keys, generator=g) < 0.6
        visible[:, 0, :] = False  # row 0 sees only the last key: every earlier tile is fully masked for it
        visible[:, 0, -1] = True
        visible[:, 1:, 0] |= ~visible[:, 1:].any(-1)  # every row sees at least one key
        s = scores.masked_fill(~visible, float("-inf"))
        m = torch.full((2, rows), float("-inf"))
        l = torch.zeros(2, rows)
        acc = torch.zeros(2, rows, dim)
        for n0 in range(0, keys, tile):
            m, l, acc = online_softmax_update(m, l, acc, s[..., n0 : n0 + tile], v[:, n0 : n0 + tile])
            assert not torch.isnan(m).any() and not torch.isnan(l).any() and not torch.isnan(acc).any(), (
                f"NaN after the tile at key {n0} (rows {rows}, keys {keys}, tile {tile}): a row with no visible "
                "key yet has max -inf, and -inf - -inf is NaN")
        out = acc / l[..., None]
        ref = torch.softmax(s.double(), dim=-1) @ v.double()  # the whole row at once
        err = float((out.double() - ref).abs().max())
        assert err < 1e-4, f"rows {rows}, keys {keys}, tile {tile}, scale {scale}: max |out - softmax @ v| = {err:.2e}"
        lse = m.double() + torch.log(l.double())
        lse_err = float((lse - torch.logsumexp(s.double(), -1)).abs().max())
        assert lse_err < 1e-4, f"m + log(l) must be the row's logsumexp (off by {lse_err:.2e})"


# ----- 05: rejection sampling -----------------------------------------------------------------
def _emitted_distribution(accept_or_resample: Callable, p: torch.Tensor, q: torch.Tensor | None, x: int,
                          grid: int = 1000) -> torch.Tensor:
    """The exact distribution of the emitted token given draft x: P(accept) from a grid of u."""
    accepted, residual = 0, None
    for j in range(grid):
        r = accept_or_resample(p, q, x, (j + 0.5) / grid)
        if r is None:
            accepted += 1
        elif residual is None:
            residual = r
    a = accepted / grid
    out = torch.zeros_like(p, dtype=torch.float64)
    out[x] += a
    if residual is not None:
        residual = residual.double()
        assert bool((residual >= 0).all()) and abs(float(residual.sum()) - 1) < 1e-5, \
            "the replacement distribution must be non-negative and sum to 1"
        out += (1 - a) * residual
    return out


def check_rejection(accept_or_resample: Callable) -> None:
    g = torch.Generator().manual_seed(0)
    vocab = 5
    cases = []
    for _ in range(3):
        p = torch.rand(vocab, generator=g) + 0.05
        q = torch.rand(vocab, generator=g) ** 3 + 0.01
        cases.append((p / p.sum(), q / q.sum()))
    p0 = torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0])
    cases.append((p0, torch.tensor([0.1, 0.1, 0.1, 0.3, 0.4])))  # the proposer likes what the target rules out
    cases.append((p0, p0.clone()))  # the proposer is the target
    for p, q in cases:  # 1. exactly: sum over x of q(x) * (emitted distribution given x) == p
        got = sum(float(q[x]) * _emitted_distribution(accept_or_resample, p, q, x) for x in range(vocab))
        err = float((got - p.double()).abs().max())
        assert err < 3e-3, f"p = {p.tolist()}, q = {q.tolist()}: emitted tokens follow {got.tolist()}, not p"
    for p, _ in cases[:2]:  # a deterministic proposer (q one-hot): whatever x it guesses, tokens follow p
        for x in range(vocab):
            got = _emitted_distribution(accept_or_resample, p, None, x)
            err = float((got - p.double()).abs().max())
            assert err < 3e-3, f"q one-hot on {x}: emitted tokens follow {got.tolist()}, not p = {p.tolist()}"
    # 2. by sampling, as the engine does: a chi-square test at a fixed seed
    p, q = cases[0]
    n = 20000
    xs = torch.multinomial(q, n, replacement=True, generator=g).tolist()
    us = torch.rand(n, generator=g).tolist()
    counts = [0] * vocab
    for x, u in zip(xs, us):
        r = accept_or_resample(p, q, x, u)
        counts[x if r is None else int(torch.multinomial(r, 1, generator=g))] += 1
    expected = [n * float(pi) for pi in p]
    chi2 = sum((c - e) ** 2 / e for c, e in zip(counts, expected))
    assert chi2 < 18.47, f"chi-square {chi2:.1f} >= 18.47 (4 degrees of freedom, p = 0.001): counts {counts}"


CHECKS: dict[str, Callable[..., None]] = {
    "block_hash": check_block_hash, "admission": check_admission, "sampling": check_sampling,
    "online_softmax": check_online_softmax, "rejection": check_rejection,
}


def run_check(exercise: str, functions: dict[str, Callable]) -> None:
    """Run one exercise's check on {function name: function}."""
    CHECKS[exercise](**functions)
