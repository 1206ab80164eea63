"""A separate draft model with its own KV pool (spec_decode/draft_model.py), on tiny random models.

Greedy output equals plain greedy decoding whatever the draft (the same weights,
a perturbed copy, an unrelated model), with a target pool small enough to
preempt and a draft pool small enough to evict and starve; the draft's pool is
whole afterwards, under a hypothesis state machine that also aborts requests.
"""
from __future__ import annotations

import copy
import json

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.trace import StepTrace
from minillm.sampling_params import SamplingParams
from tests.helpers.engine_utils import random_prompts, run_to_completion, tiny_model

VOCAB = 31


def perturbed(model, scale: float, seed: int = 0):
    """A copy of `model` with noise on every matrix: a draft that agrees often, not always."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * scale)
    return draft


def target():
    return tiny_model(seed=1, vocab=VOCAB)


DRAFTS = {
    "same_weights": lambda: tiny_model(seed=1, vocab=VOCAB),  # a second copy: accepts everything
    "perturbed": lambda: perturbed(target(), 0.03),
    "unrelated": lambda: tiny_model(seed=5, vocab=VOCAB, layers=1),
}


def engine(spec, num_blocks=256) -> LLMEngine:
    return LLMEngine(target(), None, [], EngineConfig(block_size=4, num_kv_blocks=num_blocks, max_num_seqs=8,
                                                      max_num_batched_tokens=64, speculative=spec))


def generate(spec, num_blocks=256):
    e = engine(spec, num_blocks)
    params = SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True, stop_token_ids=[7])
    for i, p in enumerate(random_prompts(8, VOCAB, 3, 12, seed=4)):
        e.add_request(str(i), p * 2, params)
    out = run_to_completion(e)  # target ref counts checked after every step
    return out, e


@pytest.fixture(scope="module")
def reference():
    return generate(None)[0]


def acceptance(e: LLMEngine) -> float:
    recs = [r for s in e.trace for r in s.spec]
    return sum(r.num_accepted for r in recs) / max(1, sum(r.num_proposed for r in recs))


@pytest.mark.parametrize("draft", sorted(DRAFTS))
@pytest.mark.parametrize("pools", [(256, None), (14, None), (256, 6)], ids=["roomy", "target_preempts", "draft_tight"])
def test_greedy_with_a_separate_draft_equals_greedy(reference, draft, pools):
    num_blocks, draft_blocks = pools
    out, e = generate({"method": "draft", "model": DRAFTS[draft](), "num_tokens": 3,
                       "num_kv_blocks": draft_blocks}, num_blocks)
    assert out == reference
    prop = e.proposer
    assert prop.bm.num_free_blocks == prop.bm.num_blocks and not prop.states  # every draft block came back
    drafts = [s.draft for s in e.trace]
    assert all(d is not None for d in drafts)
    acc = acceptance(e)
    if draft == "same_weights":
        assert acc == 1.0
    else:
        assert 0.0 < acc < 1.0
        assert any(d.blocks_freed for d in drafts)  # rejected guesses' slots rolled back (or sequences done)
    if num_blocks < 256:
        assert any(s.preemptions for s in e.trace)
    if draft_blocks is not None:
        assert any(d.starved_seqs for d in drafts) and max(d.num_used_blocks for d in drafts) <= draft_blocks
    else:
        assert not any(d.starved_seqs for d in drafts)
    assert [StepTrace.from_dict(json.loads(json.dumps(s.to_dict()))) for s in e.trace] == e.trace


def test_a_compiled_draft_beside_an_eager_target_keeps_greedy_output(reference):
    out, e = generate({"method": "draft", "model": DRAFTS["perturbed"](), "num_tokens": 3, "compile": True})
    assert out == reference
    assert e.proposer.runner.compiled_decode is not None  # the draft's decode forwards are compiled
    assert e.executor.compiled_decode is None  # the target's are not (the engine's compile=False)
    assert 0.0 < acceptance(e) < 1.0


def test_compile_is_refused_for_a_draft_built_from_the_target():
    with pytest.raises(ValueError, match="compile applies to a separate draft"):
        engine({"method": "draft", "model": "int8", "num_tokens": 2, "compile": True})
    with pytest.raises(ValueError, match="compile must be True, False or None"):
        engine({"method": "draft", "model": DRAFTS["perturbed"](), "num_tokens": 2, "compile": "yes"})


def three_running(num_tokens: int, max_tokens: int) -> LLMEngine:
    """An engine with a perturbed draft, three requests added and four steps run."""
    e = engine({"method": "draft", "model": DRAFTS["perturbed"](), "num_tokens": num_tokens})
    for i, p in enumerate(random_prompts(3, VOCAB, 5, 9, seed=3)):
        e.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    for _ in range(4):
        e.step()
    return e


def test_the_block_view_draws_the_draft_pool():
    from minillm.visualize import block_table_figure, block_table_view, draft_block_table_view

    e = three_running(num_tokens=3, max_tokens=12)
    view = draft_block_table_view(e.trace)
    d = e.trace[-1].draft
    assert view.num_blocks == d.num_blocks and view.num_used == d.num_used_blocks > 0
    assert {t.seq_id: t.physical for t in view.tables} == dict(d.block_tables)
    assert all(t.num_cached_tokens > 0 for t in view.tables)
    fig = block_table_figure(view, title="draft pool")
    assert fig.layout.title.text == "draft pool"
    plain = LLMEngine(target(), None, [], EngineConfig(block_size=4, num_kv_blocks=64))
    plain.add_request("x", [1, 2, 3], SamplingParams(max_tokens=2))
    plain.step()
    block_table_view(plain.trace)  # the target's view is unchanged
    with pytest.raises(ValueError, match="records no draft pool"):
        draft_block_table_view(plain.trace)


def test_the_draft_caches_what_the_target_accepted():
    # with a draft that always agrees, each verify accepts k guesses; the draft keeps the K/V of the
    # k - 1 it fed back and catches up only on the last guess and the target's bonus token
    e = engine({"method": "draft", "model": DRAFTS["same_weights"](), "num_tokens": 3})
    prompt = random_prompts(1, VOCAB, 10, 10, seed=2)[0]
    e.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    run_to_completion(e)
    verifies = [s for s in e.trace if s.spec and s.spec[0].num_proposed == 3]
    assert len(verifies) >= 5
    first, later = verifies[0].draft, [s.draft for s in verifies[1:]]
    assert first.num_catch_up_tokens == len(prompt) + 1  # the prompt and the first sampled token, once
    assert all(d.num_catch_up_tokens == 2 and d.num_forwards == 3 for d in later)
    assert all(d.num_tokens == 2 + 2 for d in later)  # catch-up + two guesses fed back


def test_abort_frees_the_draft_blocks_at_once():
    e = three_running(num_tokens=4, max_tokens=40)
    prop = e.proposer
    held = {sid for sid, _ in e.trace[-1].draft.block_tables}
    assert len(held) == 3
    e.abort_request("1")
    assert len(prop.states) == 2 and prop.bm.num_used_blocks > 0
    prop.bm.check_invariants(list(prop.states.values()))
    run_to_completion(e)
    assert prop.bm.num_free_blocks == prop.bm.num_blocks


def test_a_draft_of_another_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocabulary of 40 ids, the target 31"):
        engine({"method": "draft", "model": tiny_model(seed=2, vocab=40)})


def test_an_unknown_draft_model_name_is_a_clear_error():
    with pytest.raises((FileNotFoundError, ValueError), match="no-such-draft"):
        engine({"method": "draft", "model": "no-such-draft"})


class DraftPoolMachine(RuleBasedStateMachine):
    """Speculative requests (greedy and sampled) arrive, run, get aborted; both pools stay consistent."""

    def __init__(self) -> None:
        super().__init__()
        self.e = LLMEngine(target(), None, [], EngineConfig(
            block_size=4, num_kv_blocks=20, max_num_seqs=4, max_num_batched_tokens=32,
            speculative={"method": "draft", "model": DRAFTS["perturbed"](), "num_tokens": 3, "num_kv_blocks": 12}))
        self.n = 0

    @rule(length=st.integers(1, 14), max_tokens=st.integers(1, 12), sampled=st.booleans(), seed=st.integers(0, 99))
    def add(self, length, max_tokens, sampled, seed):
        prompt = random_prompts(1, VOCAB, length, length, seed=seed)[0]
        params = SamplingParams(temperature=1.0 if sampled else 0.0, max_tokens=max_tokens, ignore_eos=True, seed=seed)
        self.e.add_request(str(self.n), prompt, params)
        self.n += 1

    @precondition(lambda self: self.e.requests)
    @rule(data=st.data())
    def abort(self, data):
        rid = data.draw(st.sampled_from(sorted(self.e.requests)))
        self.e.abort_request(rid)

    @precondition(lambda self: self.e.has_unfinished_requests())
    @rule()
    def step(self):
        self.e.step()

    @invariant()
    def pools_consistent(self):
        self.e.block_manager.check_invariants(self.e.live_sequences())
        prop = self.e.proposer
        prop.bm.check_invariants(list(prop.states.values()))
        live = {s.seq_id for s in self.e.live_sequences()}
        assert set(prop.states) <= live  # nothing kept for a finished or aborted sequence

    def teardown(self):
        run_to_completion(self.e)
        prop = self.e.proposer
        assert prop.bm.num_free_blocks == prop.bm.num_blocks and not prop.states


TestDraftPoolMachine = DraftPoolMachine.TestCase
TestDraftPoolMachine.settings = settings(max_examples=25, stateful_step_count=30, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("draft", ["perturbed", "unrelated"])
def test_prompt_lookup_first_keeps_greedy_output_and_spares_the_draft(reference, draft):
    """prompt_lookup_min: sequences whose last tokens appeared before take the continuation from there, the
    rest go to the draft model (its K/V catch up later). The prompts repeat themselves (p * 2), so lookup
    serves some steps and the draft others; output is plain greedy's, and the draft's pool comes back whole."""
    out, e = generate({"method": "draft", "model": DRAFTS[draft](), "num_tokens": 3, "prompt_lookup_min": 2})
    assert out == reference
    drafts = [s.draft for s in e.trace if s.draft is not None]
    served = sum(len(d.lookup_seqs) for d in drafts)
    drafted = sum(d.num_forwards for d in drafts)
    assert served > 0 and drafted > 0
    # a step's sequences went one way or the other: lookup's never also cost draft rows in that step
    for s in e.trace:
        if s.draft is not None and s.spec and len(s.draft.lookup_seqs) == len(s.spec):
            assert s.draft.num_forwards == 0
    prop = e.proposer.draft  # the draft model's proposer keeps the pool
    assert prop.bm.num_free_blocks == prop.bm.num_blocks and not prop.states
    assert [StepTrace.from_dict(json.loads(json.dumps(s.to_dict()))) for s in e.trace] == e.trace


def test_prompt_lookup_min_is_checked():
    with pytest.raises(ValueError, match="prompt_lookup_min applies to a separate draft model"):
        engine({"method": "draft", "model": "int8", "num_tokens": 2, "prompt_lookup_min": 2})
    with pytest.raises(ValueError, match=r"prompt_lookup_min must be an integer in \[1, ngram_max=4\]"):
        engine({"method": "draft", "model": DRAFTS["perturbed"](), "num_tokens": 2, "prompt_lookup_min": 5})
