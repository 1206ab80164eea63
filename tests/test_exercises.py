"""The course's exercises (exercises/, switch: minillm/exercises.py).

* every check passes against the engine's own code ("reference") and the worked solutions;
* every check fails against the unfilled stubs (NotImplementedError), and against deliberately
  wrong solutions (an AssertionError naming the mistake) -- so a check can fail;
* the engine really calls each seam by its module name, `use(...)` swaps and restores them, the
  solutions run the engine to the same tokens as the reference, and the stubs break it.
"""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exercises.checks import CHECKS, run_check
from exercises.solutions import (ex01_block_hash as s01, ex02_admission as s02, ex03_sampling as s03,
                                 ex04_online_softmax as s04, ex05_rejection as s05)
from minillm import exercises
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.sampling_params import SamplingParams
from tests.helpers.engine_utils import make_engine, random_prompts, run_to_completion, tiny_model

ROOT = Path(__file__).resolve().parent.parent
NAMES = list(exercises.EXERCISES)


@pytest.mark.parametrize("impl", ["reference", "solutions"])
@pytest.mark.parametrize("name", NAMES)
def test_checks_pass(name, impl):
    run_check(name, exercises.implementation(name, impl))


@pytest.mark.parametrize("name", NAMES)
def test_checks_fail_on_the_stubs(name):
    fns = exercises.implementation(name, "learner")
    if not all("raise NotImplementedError" in inspect.getsource(f) for f in fns.values()):
        pytest.skip(f"exercises/{exercises.SEAMS[name][0]}.py is filled in: `python -m exercises {name}` checks it")
    with pytest.raises(NotImplementedError, match="exercise"):
        run_check(name, fns)


# ----- deliberately wrong solutions: each must fail its exercise's check ------------------------------
def _hash_without_parent(parent, token_ids):
    return s01.chain_block_hash(None, token_ids)


def _walk_including_last_token(token_ids, block_size, hash_fn, lookup):
    return s01.cached_prefix_blocks(list(token_ids) + [0], block_size, hash_fn, lookup)


def _walk_past_a_miss(token_ids, block_size, hash_fn, lookup):
    hits, parent = [], None
    for i in range((len(token_ids) - 1) // block_size):
        tokens = tuple(token_ids[i * block_size : (i + 1) * block_size])
        parent = hash_fn(parent, tokens)
        bid = lookup(parent, tokens)
        if bid is not None:
            hits.append(bid)
    return hits


def _top_p_one_token_too_few(logits, top_p, min_p, top_k=None):
    # "keep while the cumulative mass < top_p" drops the token that crosses top_p
    sorted_logits, order = logits.sort(-1, descending=True)
    probs = sorted_logits.softmax(-1)
    drop = probs.cumsum(-1) >= top_p[:, None]
    drop[:, 0] = False
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def _min_p_absolute(logits, top_p, min_p, top_k=None):
    out = s03.top_p_min_p_filter(logits, top_p, torch.zeros_like(min_p), top_k)
    return out.masked_fill(out.softmax(-1) < min_p[:, None], float("-inf"))  # not relative to the largest


def _online_softmax_no_rescale(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    shift = torch.nan_to_num(m_new, neginf=0.0)
    p = torch.exp(scores - shift[..., None])
    return m_new, torch.exp(m - shift) * l + p.sum(-1), acc + p @ v  # acc not rescaled


def _online_softmax_no_nan_guard(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(-1))
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[..., None])
    return m_new, alpha * l + p.sum(-1), alpha[..., None] * acc + p @ v


def _online_softmax_no_max(m, l, acc, scores, v):
    p = torch.exp(scores)  # overflows for large scores
    return torch.zeros_like(m), l + p.sum(-1), acc + p @ v


def _residual_is_p(p, q, token, u):
    r = s05.accept_or_resample(p, q, token, u)
    return None if r is None else p


def _accept_with_p(p, q, token, u):
    return None if u < float(p[token]) else s05.accept_or_resample(p, q, token, 1.0 - 1e-12)


MUTANTS = {
    "hash without the parent": ("block_hash", dict(chain_block_hash=_hash_without_parent,
                                                   cached_prefix_blocks=s01.cached_prefix_blocks)),
    "Python's hash": ("block_hash", dict(chain_block_hash=lambda parent, t: hash((parent, tuple(t))),
                                         cached_prefix_blocks=s01.cached_prefix_blocks)),
    "walk covers the last token": ("block_hash", dict(chain_block_hash=s01.chain_block_hash,
                                                      cached_prefix_blocks=_walk_including_last_token)),
    "walk goes on past a miss": ("block_hash", dict(chain_block_hash=s01.chain_block_hash,
                                                    cached_prefix_blocks=_walk_past_a_miss)),
    "chunks without chunked prefill": ("admission", dict(
        admit_within_budget=lambda r, b, s, c: max(0, min(r, b)) if s > 0 else 0)),
    "ignores seats": ("admission", dict(
        admit_within_budget=lambda r, b, s, c: s02.admit_within_budget(r, b, 1, c))),
    "top-p keeps one token too few": ("sampling", dict(top_p_min_p_filter=_top_p_one_token_too_few)),
    "min-p not relative": ("sampling", dict(top_p_min_p_filter=_min_p_absolute)),
    "online softmax without rescaling acc": ("online_softmax", dict(online_softmax_update=_online_softmax_no_rescale)),
    "online softmax without the -inf guard": ("online_softmax", dict(online_softmax_update=_online_softmax_no_nan_guard)),
    "softmax without the running max": ("online_softmax", dict(online_softmax_update=_online_softmax_no_max)),
    "residual p instead of max(p - q, 0)": ("rejection", dict(accept_or_resample=_residual_is_p)),
    "accept with p(x), not min(1, p/q)": ("rejection", dict(accept_or_resample=_accept_with_p)),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_checks_catch_wrong_solutions(mutant):
    name, fns = MUTANTS[mutant]
    with pytest.raises(AssertionError):
        with torch.no_grad(), _quiet_numpy():
            CHECKS[name](**fns)


def _quiet_numpy():
    import numpy as np

    return np.errstate(all="ignore")


# ----- the switch and the engine ------------------------------------------------------------------
SEAM_OBJECTS = [(mod, attr) for name in NAMES for mod, attr in exercises.SEAMS[name][1]]


def _bound(mod: str, attr: str):
    import importlib

    return getattr(importlib.import_module(mod), attr)


def test_use_swaps_the_seams_and_restores_them():
    before = {seam: _bound(*seam) for seam in SEAM_OBJECTS}
    assert exercises.current() == {n: "reference" for n in NAMES}
    with exercises.use("solutions", only=["sampling", "admission"]):
        from minillm.engine import sampler, scheduler

        assert sampler.top_p_min_p_filter is s03.top_p_min_p_filter
        assert scheduler.admit_within_budget is s02.admit_within_budget
        assert exercises.current()["sampling"] == "solutions" and exercises.current()["rejection"] == "reference"
        with exercises.use("learner"):
            assert all(exercises.current()[n] == "learner" for n in NAMES)
        assert sampler.top_p_min_p_filter is s03.top_p_min_p_filter
    assert {seam: _bound(*seam) for seam in SEAM_OBJECTS} == before
    assert exercises.parse_env("learner:block_hash, sampling") == ("learner", ["block_hash", "sampling"])
    assert exercises.parse_env("solutions") == ("solutions", None)
    with pytest.raises(ValueError, match="unknown exercise"):
        exercises.use("learner", only=["nope"])


@pytest.fixture(scope="module")
def model():
    return tiny_model()


PROMPTS = random_prompts(6, 97, 5, 40, seed=3)
SHARED = [PROMPTS[0] * 2 + p for p in PROMPTS[1:4]]  # prefix-cache hits


def _run(model, params_for, backend="torch", **kw):
    eng = make_engine(model, num_blocks=256, block_size=4, max_num_batched_tokens=16, backend=backend, **kw)
    for i, p in enumerate(PROMPTS + SHARED):
        eng.add_request(str(i), p, params_for(i))
    out = run_to_completion(eng)
    return [out[str(i)] for i in range(len(PROMPTS + SHARED))], eng


def _params(i: int) -> SamplingParams:
    if i % 2:
        return SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    return SamplingParams(temperature=0.9, top_p=0.8, min_p=0.05, top_k=30, seed=i, max_tokens=8, ignore_eos=True)


def test_the_engine_calls_every_seam(model, monkeypatch):
    """Spies on the module names: the engine finds each seam there (so use() can swap it)."""
    calls = {seam: 0 for seam in SEAM_OBJECTS}
    import importlib

    for mod, attr in SEAM_OBJECTS:
        fn = _bound(mod, attr)

        def spy(*a, _fn=fn, _seam=(mod, attr), **k):
            calls[_seam] += 1
            return _fn(*a, **k)

        monkeypatch.setattr(importlib.import_module(mod), attr, spy)
    _run(model, _params, backend="tiled")
    eng = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=128, max_num_batched_tokens=64,
                                                  speculative={"method": "ngram", "num_tokens": 3}))
    eng.add_request("r", [5, 6, 7, 8] * 6, SamplingParams(temperature=0.8, top_k=2, seed=1, max_tokens=32))
    run_to_completion(eng)
    assert all(calls.values()), {f"{m}.{a}": n for (m, a), n in calls.items()}


def test_solutions_run_the_engine_to_the_reference_tokens(model):
    ref, eng_ref = _run(model, _params)
    with exercises.use("solutions"):
        got, eng = _run(model, _params)
    assert got == ref
    hits = sum(t.prefix_hit_tokens for t in eng.trace)
    assert hits > 0 and hits == sum(t.prefix_hit_tokens for t in eng_ref.trace)
    assert [t.num_prefill_tokens for t in eng.trace] == [t.num_prefill_tokens for t in eng_ref.trace]


def test_tiled_backend_matches_torch_and_runs_the_solution(model):
    greedy = lambda i: SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)  # noqa: E731
    ref, _ = _run(model, greedy)
    tiled, _ = _run(model, greedy, backend="tiled")
    assert tiled == ref
    with exercises.use("solutions", only=["online_softmax"]):
        assert _run(model, greedy, backend="tiled")[0] == ref


@pytest.mark.parametrize("name", NAMES)
def test_the_stubs_break_the_engine(model, name):
    """With the learner's (unfilled) code switched in, the engine runs into it and stops."""
    fns = exercises.implementation(name, "learner")
    if not all("raise NotImplementedError" in inspect.getsource(f) for f in fns.values()):
        pytest.skip("filled in")
    with exercises.use("learner", only=[name]), pytest.raises(NotImplementedError, match="exercise"):
        if name == "rejection":
            eng = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=128,
                                                          speculative={"method": "ngram", "num_tokens": 3}))
            eng.add_request("r", [5, 6, 7, 8] * 6, SamplingParams(temperature=0.8, top_k=2, seed=1, max_tokens=32))
            run_to_completion(eng)
        else:
            _run(model, _params, backend="tiled" if name == "online_softmax" else "torch")


def test_the_environment_variable_and_the_runner():
    """MINILLM_EXERCISES switches at import; `python -m exercises` reports every stub as TODO."""
    env = dict(os.environ, MINILLM_EXERCISES="learner:admission")
    code = ("import minillm; from minillm import exercises; from minillm.engine import scheduler; "
            "print(exercises.current()['admission'], scheduler.admit_within_budget.__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["learner", "exercises.ex02_admission"]
    env.pop("MINILLM_EXERCISES")
    run = subprocess.run([sys.executable, "-m", "exercises"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    stubs = [n for n in NAMES if all("raise NotImplementedError" in inspect.getsource(f)
                                     for f in exercises.implementation(n, "learner").values())]
    if len(stubs) == len(NAMES):
        assert run.returncode == 1 and run.stdout.count("TODO") == len(NAMES), run.stdout + run.stderr


@pytest.mark.parametrize("window", [None, 5])
def test_tiled_attention_matches_the_torch_backend(window):
    """Chunks after a cached prefix, GQA, a sliding window and a tree of drafts, vs the torch backend's math."""
    from minillm.attention import torch_backend
    from minillm.attention.tiled_backend import chunk_visibility, tiled_attention

    g = torch.Generator().manual_seed(1)
    seq_len, lq, heads, kvh, d = 45, 11, 4, 2, 8
    q = torch.randn(lq, heads, d, generator=g)
    k, v = torch.randn(seq_len, kvh, d, generator=g), torch.randn(seq_len, kvh, d, generator=g)
    ref = torch_backend.prefill_one(q, k, v, seq_len, 0.3, window)
    got = tiled_attention(q, k, v, 0.3, chunk_visibility(seq_len, lq, window, None, q.device), tile=8)
    assert torch.allclose(got, ref, atol=1e-5)
    parents = [-1, 0, 0, 1, 2, 3, -1, 6, 7, 4, 9]  # a tree of 11 draft nodes (root = the last accepted token)
    depth = torch.zeros(lq, dtype=torch.long)
    mask = torch.zeros(lq, lq, dtype=torch.bool)  # a node sees itself and its ancestors
    for i, p in enumerate(parents):
        mask[i, i] = True
        if p >= 0:
            mask[i] |= mask[p]
            depth[i] = depth[p] + 1
    ref = torch_backend.prefill_tree(q, k, v, seq_len, 0.3, mask, depth, window)
    got = tiled_attention(q, k, v, 0.3, chunk_visibility(seq_len, lq, window, (mask, depth), q.device), tile=8)
    assert torch.allclose(got, ref, atol=1e-5)


def test_the_solution_digests_equal_the_engines():
    from minillm.engine.block_manager import sha256_chain_hash

    first = s01.chain_block_hash(None, (1, 2, 3, 4))
    assert first == sha256_chain_hash(None, (1, 2, 3, 4))
    assert s01.chain_block_hash(first, [5, 6, 7]) == sha256_chain_hash(first, [5, 6, 7])
