"""Speculative decoding parts on their own, and the engine with a tiny random model (fast)."""
from __future__ import annotations

import json

import pytest
import torch

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.trace import StepTrace
from minillm.sampling_params import SamplingParams
from minillm.spec_decode import parse_speculative
from minillm.spec_decode.ngram import NgramProposer
from minillm.spec_decode.rejection import verify_tokens
from tests.helpers.engine_utils import random_prompts, run_to_completion, tiny_model


@pytest.mark.parametrize("bad, match", [
    ({"method": "lookahead"}, "method must be one of"),
    ({"method": "medusa", "heads": 3}, "heads must be a path"),
    ({"num_tokens": 4}, "'method' is required"),
    ({"method": "ngram", "num_tokens": 0}, "num_tokens"),
    ({"method": "ngram", "ngram_min": 3, "ngram_max": 2}, "must not exceed"),
    ({"method": "ngram", "k": 3}, "unknown key"),
    ({"method": "draft", "model": 3}, "draft model must be one of"),
    ({"method": "draft", "model": "some-draft", "num_layers": 2}, "num_layers applies to drafts built from"),
    ({"method": "draft", "model": "some-draft", "quantization": "int3"}, "draft quantization"),
    ({"method": "draft", "model": "self"}, "needs num_layers"),
    ({"method": "draft", "model": "int4", "num_layers": 0}, "num_layers"),
    ("ngram", "must be a dict"),
])
def test_bad_speculative_configs_name_the_problem(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_speculative(bad)


def test_llm_rejects_a_bad_config_before_loading_the_model():
    from minillm.llm import LLM

    with pytest.raises(ValueError, match="num_tokens"):
        LLM(model="/nonexistent/model.gguf", speculative={"method": "ngram", "num_tokens": 99})


def test_draft_self_cannot_use_every_layer():
    model = tiny_model(layers=2)
    with pytest.raises(ValueError, match="is the target itself"):
        LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=64,
                                                speculative={"method": "draft", "model": "self", "num_layers": 2}))


def test_ngram_proposes_the_continuation_of_the_latest_longest_match():
    ng = NgramProposer(ngram_max=3, ngram_min=1)
    #         0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 2, 6, 7]
    # suffix "6 7": latest earlier match at 6..7 continues with 2, 6, 7
    assert ng.propose_one(tokens, 3) == [2, 6, 7]
    assert ng.propose_one(tokens, 1) == [2]
    assert ng.propose_one([1, 2, 3], 4) == []  # no earlier occurrence of anything
    assert NgramProposer(3, 3).propose_one(tokens, 2) == []  # "2 6 7" never occurred before


def test_greedy_verify_is_exact_match_plus_one_target_token():
    logits = torch.full((4, 10), -5.0)
    for row, tok in enumerate([3, 4, 9, 1]):
        logits[row, tok] = 5.0
    greedy = SamplingParams(temperature=0.0)
    assert verify_tokens(logits, [3, 4, 9], None, greedy) == ([3, 4, 9, 1], 3)  # all accepted + bonus
    assert verify_tokens(logits, [3, 7, 9], None, greedy) == ([3, 4], 1)  # correction at the first miss
    assert verify_tokens(logits[:1], [], None, greedy) == ([3], 0)


def test_sampled_verify_never_emits_a_token_the_target_forbids():
    # top_k=1 leaves the target one token: a wrong draft is always rejected and corrected
    logits = torch.randn(3, 16)
    params = SamplingParams(temperature=1.0, top_k=1)
    best = logits.argmax(-1).tolist()
    wrong = [(best[0] + 1) % 16, best[1]]
    tokens, n = verify_tokens(logits, wrong, None, params, torch.Generator().manual_seed(0))
    assert (tokens, n) == ([best[0]], 0)


def tiny_engine(speculative=None, num_blocks=256, block_size=4):
    return LLMEngine(tiny_model(seed=1, vocab=31), None, [],
                     EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, max_num_seqs=8,
                                  max_num_batched_tokens=64, speculative=speculative))


SPECS = [None, {"method": "ngram", "num_tokens": 5, "ngram_max": 3},
         {"method": "draft", "model": "self", "num_layers": 1, "num_tokens": 3}]


def generate(speculative, params: SamplingParams, num_blocks=256):
    e = tiny_engine(speculative, num_blocks)
    for i, p in enumerate(random_prompts(8, 31, 3, 12, seed=4)):
        e.add_request(str(i), p * 2, params)  # repeated prompts: the n-gram proposer has matches
    out = run_to_completion(e)  # checks ref counts against block tables after every step
    assert e.block_manager.num_free_blocks == e.block_manager.num_blocks
    return out, e


@pytest.mark.parametrize("num_blocks", [256, 14])  # 14 blocks of 4 force preemption
def test_tiny_greedy_with_stop_tokens_and_preemption(num_blocks):
    # stop tokens and max_tokens end runs in the middle of an accepted stretch
    params = SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True, stop_token_ids=[7])
    ref, _ = generate(None, params)
    for spec in SPECS[1:]:
        out, e = generate(spec, params, num_blocks)
        assert out == ref, spec
        assert sum(r.num_accepted for s in e.trace for r in s.spec) > 0
        if num_blocks < 256:
            assert any(s.preemptions for s in e.trace)
        # the spec records survive the trace's JSON form (views and reports read saved traces)
        assert [StepTrace.from_dict(json.loads(json.dumps(s.to_dict()))) for s in e.trace] == e.trace


def test_scheduler_budget_counts_the_lookahead():
    # 8 decoding sequences x (1 + 5 lookahead) would need 48 tokens; the budget is 16
    e = LLMEngine(tiny_model(seed=1, vocab=31), None, [],
                  EngineConfig(block_size=4, num_kv_blocks=256, max_num_seqs=8, max_num_batched_tokens=16,
                               speculative={"method": "ngram", "num_tokens": 5}))
    for i, p in enumerate(random_prompts(8, 31, 3, 6, seed=2)):
        e.add_request(str(i), p * 3, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    run_to_completion(e)
    for step in e.trace:
        assert sum(s.num_new_tokens for s in step.scheduled) <= step.token_budget  # drafts included
    assert any(s.num_spec_tokens for s in e.trace)
    assert max(len(s.scheduled) for s in e.trace) > 2
    from minillm.metrics import summarize

    acc = summarize(e.trace).spec_acceptance  # metrics read the same records
    accepted = sum(r.num_accepted for s in e.trace for r in s.spec)
    assert acc == accepted / sum(r.num_proposed for s in e.trace for r in s.spec) and 0 < acc <= 1  # decodes without lookahead still share the step


@pytest.mark.parametrize("spec", SPECS[1:], ids=["ngram", "draft"])
def test_triton_backend_verifies_like_torch(spec):
    # the verify forward is a multi-token chunk over cached context: the Triton prefill kernel's case
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    ref, _ = generate(None, params)
    e = LLMEngine(tiny_model(seed=1, vocab=31), None, [],
                  EngineConfig(block_size=16, num_kv_blocks=64, max_num_seqs=8, max_num_batched_tokens=64,
                               attention_backend="triton", speculative=spec))
    for i, p in enumerate(random_prompts(8, 31, 3, 12, seed=4)):
        e.add_request(str(i), p * 2, params)
    assert run_to_completion(e) == ref
    assert sum(r.num_accepted for s in e.trace for r in s.spec) > 0
