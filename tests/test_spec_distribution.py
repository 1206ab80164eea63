"""Speculative sampling keeps the target's distribution: chi-square on a tiny model with a tiny vocabulary.

The exact probability of every 3-token continuation is computed from the target's
logits; the engine samples thousands of continuations with speculation and the
counts must fit. Breaking the acceptance rule or the residual on purpose must make
the same test fail, so it has the power to catch a wrong rule.
"""
from __future__ import annotations

import pytest
import torch

from minillm.models.standalone import forward_logits
from minillm.sampling_params import SamplingParams
from minillm.spec_decode import rejection
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from tests.helpers.engine_utils import tiny_model

VOCAB = 5
NEW = 3
PROMPT = [1, 2, 3, 1, 2, 4, 1, 2]  # repeats "1 2": the n-gram proposer finds matches
SAMPLES = 4000


def target_distribution(model) -> dict[tuple[int, ...], float]:
    """P(continuation) for every NEW-token continuation, from the target's own softmax."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(NEW):
        nxt = {}
        for prefix, pr in probs.items():
            p = forward_logits(model, PROMPT + list(prefix))[-1].softmax(-1)
            for t in range(VOCAB):
                nxt[prefix + (t,)] = pr * float(p[t])
        probs = nxt
    return probs


def sample_with_spec(model, speculative: dict) -> dict[tuple[int, ...], int]:
    torch.manual_seed(0)
    engine = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=2048, max_num_seqs=512,
                                                     max_num_batched_tokens=4096, speculative=speculative))
    params = SamplingParams(temperature=1.0, max_tokens=NEW, ignore_eos=True)
    for i in range(SAMPLES):
        engine.add_request(str(i), PROMPT, params)
    counts: dict[tuple[int, ...], int] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                key = tuple(out.outputs[0].token_ids)
                counts[key] = counts.get(key, 0) + 1
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    proposed = sum(r.num_proposed for s in engine.trace for r in s.spec)
    assert proposed > SAMPLES // 2, "the proposer must actually propose for the test to mean anything"
    return counts


def p_value(counts, probs) -> float:
    """Chi-square over cells, the rare ones (expected < 5) pooled into one."""
    obs, exp, rare_o, rare_e = [], [], 0, 0.0
    for cell, pr in probs.items():
        e = pr * SAMPLES
        if e < 5:
            rare_o, rare_e = rare_o + counts.get(cell, 0), rare_e + e
        else:
            obs.append(counts.get(cell, 0))
            exp.append(e)
    if rare_e > 0:
        obs.append(rare_o)
        exp.append(rare_e)
    scale = sum(obs) / sum(exp)  # float rounding
    stat = sum((o - e * scale) ** 2 / (e * scale) for o, e in zip(obs, exp))
    # chi-square survival function with len - 1 degrees of freedom: Q(df / 2, stat / 2)
    df = torch.tensor((len(obs) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.fixture(scope="module")
def toy():
    model = tiny_model(seed=3, vocab=VOCAB, layers=2)
    return model, target_distribution(model)


SPECS = {
    "ngram": {"method": "ngram", "num_tokens": 3, "ngram_max": 2},
    "draft": {"method": "draft", "model": "self", "num_layers": 1, "num_tokens": 3},
    # a separate draft model with its own KV pool: another random model of the same vocabulary,
    # so q differs from p everywhere and the residual max(p - q, 0) matters
    "draft_model": {"method": "draft", "model": "separate", "num_tokens": 3},
    # the same draft with its LM head cut to 3 of the 5 ids (draft_vocab.py): q is 0 on ids 2 and 4,
    # which only the residual can produce
    "draft_model_vocab": {"method": "draft", "model": "separate_restricted", "num_tokens": 3},
    # Medusa: deterministic top-1 guesses from heads on the target's hidden state (random heads here)
    "medusa": {"method": "medusa", "heads": "random", "num_tokens": 2},
    # a tree of their top-2 per head (6 candidates): several deterministic children per node
    "medusa_tree": {"method": "medusa", "heads": "random", "tree": [2, 2]},
}


def spec_for(name: str) -> dict:
    spec = dict(SPECS[name])
    if spec.get("model") in ("separate", "separate_restricted"):
        restricted = spec["model"] == "separate_restricted"
        spec["model"] = tiny_model(seed=11, vocab=VOCAB, layers=1)
        if restricted:
            from minillm.spec_decode.draft_vocab import restrict_lm_head

            restrict_lm_head(spec["model"], torch.tensor([0, 1, 3]))
    if spec.get("heads") == "random":
        from minillm.spec_decode.medusa_heads import MedusaHeads

        torch.manual_seed(12)
        heads = MedusaHeads(tiny_model(seed=3, vocab=VOCAB, layers=2).config.hidden_size, 2)
        with torch.no_grad():
            for p in heads.parameters():
                p.normal_(0, 0.3)
        spec["heads"] = heads
    return spec


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
def test_speculative_sampling_matches_the_target(toy, name):
    model, probs = toy
    pv = p_value(sample_with_spec(model, spec_for(name)), probs)
    print(name, "p-value", pv)
    assert pv > 1e-3


BROKEN = {
    # accept every draft token: the output follows the proposer, not the target
    "always_accept": ("acceptance_probability", lambda p_x, q_x: 1.0),
    # after a rejection draw from p instead of max(p - q, 0): rejected tokens come back too often
    "resample_from_p": ("residual_distribution", lambda p, q, x: p),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_broken_rule_fails_the_same_test(toy, name, broken, monkeypatch):
    model, probs = toy
    attr, fn = BROKEN[broken]
    monkeypatch.setattr(rejection, attr, fn)
    pv = p_value(sample_with_spec(model, spec_for(name)), probs)
    print(name, broken, "p-value", pv)
    assert pv < 1e-6
