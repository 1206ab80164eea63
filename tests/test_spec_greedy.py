"""Greedy decoding with speculation is token-for-token greedy decoding without it (default model).

Both proposers, a continuous batch of several sequences, and a KV pool small enough
that the scheduler must preempt; the pool is whole afterwards and the trace records
every proposal.
"""
from __future__ import annotations

import pytest

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from tests.test_engine_default_model import QUESTIONS, chat_ids, run

pytestmark = [pytest.mark.default_model, pytest.mark.slow]

MAX_TOKENS = 24
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"


def prompts(tok) -> list[list[int]]:
    # chat questions, and one that asks to repeat its input (where prompt lookup shines)
    return [chat_ids(tok, q) for q in QUESTIONS[:3]] + [chat_ids(tok, "Repeat this code exactly:\n" + CODE)]


def engine(loaded, speculative=None, num_blocks=None) -> LLMEngine:
    return LLMEngine(
        loaded.model, loaded.tokenizer, loaded.eos_token_ids,
        EngineConfig(block_size=16, num_kv_blocks=num_blocks, kv_cache_memory_bytes=64 << 20,
                     max_num_seqs=16, max_num_batched_tokens=512, speculative=speculative),
    )


@pytest.fixture(scope="module")
def reference(default_model):
    return run(engine(default_model), prompts(default_model.tokenizer), MAX_TOKENS)


SPECS = {
    "ngram": {"method": "ngram", "num_tokens": 4},
    "draft_int4": {"method": "draft", "model": "int4", "num_tokens": 4},
    "medusa": {"method": "medusa", "num_tokens": 3},  # the heads shipped for the default model
    # a tree of their top-k candidates (spec_decode/tree.py): paths off the first branch get accepted
    "medusa_tree": {"method": "medusa", "tree": [[0], [1], [2], [3], [0, 0], [0, 1], [1, 0], [0, 0, 0]]},
    # Hydra's shipped heads (they read the guesses before them), a chain ranked on a cut LM head, and a tree
    "hydra_vocab": {"method": "hydra", "num_tokens": 2, "draft_vocab": 8192},
    "hydra_tree": {"method": "hydra", "tree": [3, 2]},
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_greedy_speculation_equals_greedy(default_model, reference, name):
    e = engine(default_model, SPECS[name])
    assert run(e, prompts(default_model.tokenizer), MAX_TOKENS) == reference  # run() checks the pool is whole
    records = [r for step in e.trace for r in step.spec]
    proposed = sum(r.num_proposed for r in records)
    accepted = sum(r.num_accepted for r in records)
    assert proposed > 0 and accepted > 0
    for r in records:
        assert 0 <= r.num_accepted <= r.num_proposed == len(r.draft_token_ids)
        assert 1 <= r.num_emitted <= r.num_accepted + 1
        if r.draft_parents and name.endswith("_tree"):  # a tree: the bonus comes at a leaf
            assert r.bonus == (r.num_accepted > 0 and r.accepted_nodes[-1] not in r.draft_parents)
            assert len(r.accepted_nodes) == r.num_accepted
        else:
            assert r.bonus == (r.num_proposed > 0 and r.num_accepted == r.num_proposed)
    # every emitted token was recorded as a new token of its step; fewer steps than tokens
    steps_decoding = [s for s in e.trace if s.spec]
    assert len(steps_decoding) < len(prompts(default_model.tokenizer)) * MAX_TOKENS
    assert any(s.phase == "verify" for step in e.trace for s in step.scheduled)
    assert sum(step.num_spec_tokens for step in e.trace) == proposed


@pytest.mark.parametrize("name", sorted(SPECS))
def test_greedy_speculation_survives_preemption(default_model, reference, name):
    # 4 sequences of ~40-60 prompt + 24 new tokens need ~20 blocks of 16: 9 force preemption
    e = engine(default_model, SPECS[name], num_blocks=9)
    assert run(e, prompts(default_model.tokenizer), MAX_TOKENS) == reference
    assert sum(len(s.preemptions) for s in e.trace) > 0
    assert sum(r.num_accepted for s in e.trace for r in s.spec) > 0


def test_tree_paths_off_the_first_branch_need_their_kv_moved(default_model, reference, monkeypatch):
    """The same run without the K/V moves after a tree's verification: later tokens go wrong."""
    import minillm.spec_decode.tree as tree  # the engine imports tree_kv_moves from here at each step

    e = engine(default_model, SPECS["medusa_tree"])
    assert run(e, prompts(default_model.tokenizer), MAX_TOKENS) == reference
    moved = [r for s in e.trace for r in s.spec if r.accepted_nodes != tuple(range(len(r.accepted_nodes)))]
    assert moved, "some accepted path must leave the first branch for this test to mean anything"
    monkeypatch.setattr(tree, "tree_kv_moves", lambda *a: [])
    assert run(engine(default_model, SPECS["medusa_tree"]), prompts(default_model.tokenizer), MAX_TOKENS) != reference
