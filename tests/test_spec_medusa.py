"""Medusa-1 heads: training on a frozen model, the file format, and the proposer inside the engine.

Tiny random models (fast): greedy with Medusa guesses equals plain greedy, with preemption;
the heads learn (held-out accuracy above an untrained head's); a bad or foreign heads file is a
clear error. The shipped heads of the default model are checked in test_spec_greedy.py.
"""
from __future__ import annotations

import random

import pytest
import torch

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.sampling_params import SamplingParams
from minillm.spec_decode.hydra_heads import load_heads
from minillm.spec_decode.medusa_heads import MedusaHeads
from minillm.spec_decode.medusa import embedding_fingerprint
from minillm.spec_decode.medusa_train import MedusaTrainConfig, train_heads
from tests.helpers.engine_utils import random_prompts, run_to_completion, tiny_model

VOCAB = 31


def random_heads(model, k=3, seed=0, scale=0.3, kind=MedusaHeads, layers=1) -> MedusaHeads:
    heads = kind(model.config.hidden_size, k, layers)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return heads


def generate(spec, num_blocks=256, lm_head=None, tweak=None):
    """lm_head: a head that ranks the Medusa guesses instead of the target's own (draft_vocab's kind).
    tweak: called with the engine before any request."""
    e = LLMEngine(tiny_model(seed=1, vocab=VOCAB), None, [], EngineConfig(
        block_size=4, num_kv_blocks=num_blocks, max_num_seqs=8, max_num_batched_tokens=64, speculative=spec))
    if lm_head is not None:
        e.proposer.lm_head = lm_head(e.executor.model)
    if tweak is not None:
        tweak(e)
    params = SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True, stop_token_ids=[7])
    for i, p in enumerate(random_prompts(8, VOCAB, 3, 12, seed=4)):
        e.add_request(str(i), p * 2, params)
    return run_to_completion(e), e


@pytest.mark.parametrize("num_blocks", [256, 14])
def test_greedy_with_medusa_guesses_equals_greedy(num_blocks):
    ref, _ = generate(None)
    model = tiny_model(seed=1, vocab=VOCAB)
    for heads in (MedusaHeads(model.config.hidden_size, 3), random_heads(model)):  # untrained (copies), random
        out, e = generate({"method": "medusa", "heads": heads, "num_tokens": 3}, num_blocks)
        assert out == ref
        recs = [r for s in e.trace for r in s.spec]
        assert sum(r.num_proposed for r in recs) > 0
        assert not e.proposer.hidden  # nothing kept for finished sequences
        if num_blocks < 256:
            assert any(s.preemptions for s in e.trace)


@pytest.mark.parametrize("spec", [{"num_tokens": 3}, {"num_tokens": 1}, {"tree": [3, 2, 1]}])
def test_guesses_ranked_in_the_verify_steps_lm_head_pass_are_the_same_guesses(spec):
    """The heads' outputs for every logit row share the step's LM-head product (ModelRunner.logit_extras):
    the proposals are the ones a pass of their own gives, and the LM head runs once per step."""
    model = tiny_model(seed=1, vocab=VOCAB)
    spec = {"method": "medusa", "heads": random_heads(model), **spec}
    calls = {}

    def counting(name, fuse):
        def tweak(e):
            m = e.executor.model
            forward = m.compute_logits
            calls[name] = 0

            def compute_logits(h):
                calls[name] += 1
                return forward(h)
            m.compute_logits = compute_logits
            if fuse:
                e.proposer.rows_per_read = 10**6  # every step's rows fit one weight pass: always share it
            else:
                e.executor.logit_extras = None
        return tweak

    ref, _ = generate(None)
    shared, e1 = generate(spec, tweak=counting("shared", True))
    alone, e2 = generate(spec, tweak=counting("alone", False))
    assert shared == alone == ref
    guesses = lambda e: [(r.seq_id, r.draft_token_ids) for s in e.trace for r in s.spec]  # noqa: E731
    assert guesses(e1) == guesses(e2) and any(g for _, g in guesses(e1))
    assert calls["shared"] == len(e1.trace) < calls["alone"]  # one LM-head product per step
    assert not e1.proposer.ranked and not e1.proposer.hidden  # nothing kept for finished sequences


def test_guesses_ranked_on_kept_rows_keep_greedy_output():
    """draft_vocab for Medusa: the guesses ranked on a copy of the even rows of the target's head. Greedy
    output equals plain decoding, every guess is even, and the target's own head stays whole."""
    from minillm.spec_decode.draft_vocab import RestrictedLMHead, restricted_head

    ref, _ = generate(None)
    heads = random_heads(tiny_model(seed=1, vocab=VOCAB))
    out, e = generate({"method": "medusa", "heads": heads, "num_tokens": 3},
                      lm_head=lambda m: restricted_head(m.lm_head, torch.arange(0, VOCAB, 2), VOCAB))
    assert out == ref
    guesses = [t for s in e.trace for r in s.spec for t in r.draft_token_ids]
    assert guesses and all(t % 2 == 0 for t in guesses)
    assert not isinstance(e.executor.model.lm_head, RestrictedLMHead)
    assert e.executor.model.lm_head.out_features == VOCAB
    with pytest.raises(ValueError, match="needs the target's tokenizer"):  # tiny models have none to count with
        generate({"method": "medusa", "heads": heads, "num_tokens": 3, "draft_vocab": 8})


@pytest.mark.parametrize("num_blocks", [256, 14])
def test_greedy_with_a_medusa_tree_equals_greedy(num_blocks):
    ref, _ = generate(None)
    model = tiny_model(seed=1, vocab=VOCAB)
    out, e = generate({"method": "medusa", "heads": random_heads(model), "tree": [3, 2, 1]}, num_blocks)
    assert out == ref
    recs = [r for s in e.trace for r in s.spec]
    assert sum(r.num_proposed for r in recs) > 0
    # a one-node prefix of the tree (a short budget) is a chain, verified as one; anything longer is a tree
    assert all(bool(r.draft_parents) == (r.num_proposed > 1) for r in recs if r.num_proposed)
    assert max(r.num_proposed for r in recs) > 3  # more candidates than a chain of 3 heads holds
    if num_blocks < 256:
        assert any(s.preemptions for s in e.trace)


def test_tree_config_errors():
    model = tiny_model(seed=1, vocab=VOCAB)
    heads = MedusaHeads(model.config.hidden_size, 2)
    for spec, match in [({"method": "medusa", "heads": heads, "tree": [2, 2, 2]}, "exceeds the 2 Medusa heads"),
                        ({"method": "medusa", "heads": heads, "tree": [[1, 1]]}, "no parent"),
                        ({"method": "medusa", "heads": heads, "tree": [9, 9]}, "at most 64"),
                        ({"method": "ngram", "tree": [2]}, "tree applies to methods")]:
        with pytest.raises(ValueError, match=match):
            LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=64, speculative=spec))


def test_medusa_needs_as_many_heads_as_guesses():
    model = tiny_model(seed=1, vocab=VOCAB)
    with pytest.raises(ValueError, match="exceeds the 2 Medusa heads"):
        LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=64, speculative={
            "method": "medusa", "heads": MedusaHeads(model.config.hidden_size, 2), "num_tokens": 3}))
    # nor may a sweep raise k past them later (a bench once ran k = 3 on 2 heads as k = 2, silently)
    e = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=64, speculative={
        "method": "medusa", "heads": MedusaHeads(model.config.hidden_size, 2), "num_tokens": 1}))
    e.set_num_speculative_tokens(2)
    with pytest.raises(ValueError, match="exceeds the 2 Medusa heads"):
        e.set_num_speculative_tokens(3)
    assert e.config.speculative.num_tokens == 2


def test_heads_file_round_trip_and_errors(tmp_path):
    model = tiny_model(seed=1, vocab=VOCAB)
    heads = random_heads(model, 2)
    path = tmp_path / "h.safetensors"
    heads.save(path, base_model="tiny", loss_curve=[(1, 2.0)])
    back = load_heads(path, model.config.hidden_size)
    assert back.num_heads == 2 and back.metadata["base_model"] == "tiny"
    h = torch.randn(5, model.config.hidden_size)
    torch.testing.assert_close(back(h), heads(h), rtol=0, atol=0)
    with pytest.raises(ValueError, match="hidden size"):
        load_heads(path, model.config.hidden_size + 8)
    with pytest.raises(FileNotFoundError, match="train-medusa"):
        load_heads(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a readable Medusa heads file"):
        load_heads(bad)


@pytest.mark.default_model
@pytest.mark.slow
@pytest.mark.parametrize("kind, loss", [("medusa", {}), ("hydra", {}),
                                        ("hydra", {"distill": True, "feature_weight": 0.1})])
def test_training_teaches_the_heads_the_default_models_own_continuations(default_model, kind, loss):
    # a short run of the real recipe (its own greedy answers, frozen base): head 1's held-out top-1
    # must beat an untrained head's (which repeats the LM head's guess for t + 1), and training
    # loss must fall. (A random tiny model's text has no structure to learn.) The third case learns
    # the base model's whole distribution and regresses onto its states (--distill --feature-weight).
    m = default_model
    cfg = MedusaTrainConfig(kind=kind, num_heads=2, num_chat_prompts=16, num_general_questions=24, max_new_tokens=40, epochs=3,
                            batch_positions=48, lr=3e-3, holdout=0.2, **loss)
    heads, report = train_heads(m.model, m.tokenizer, m.eos_token_ids, cfg, log=lambda s: None)
    assert report.num_train_positions > 400 and report.steps > 20
    first, last = report.loss_curve[0][1], report.loss_curve[-1][1]
    assert last < 0.8 * first, report.loss_curve
    assert heads.metadata["base_fingerprint"] == embedding_fingerprint(m.model)
    assert heads.kind == kind
    top1, untrained = report.holdout_top1, report.holdout_untrained_top1
    assert top1[0] > untrained[0] + 0.1, (top1, untrained)
    assert report.holdout_chain_acceptance[1] <= report.holdout_chain_acceptance[0] <= top1[0]


def test_training_prompts_stay_off_the_measured_chat_prompts():
    # the heads must be measured on questions they never saw, about subjects they never saw
    from minillm.bench.spec import CHAT, COMPLETE
    from minillm.spec_decode.medusa_prompts import BENCH_SUBJECTS, CODE_HEADS, GENERAL_QUESTIONS, general_questions

    notebook_chat = ("Why is the sky blue?", "Give me three tips for sleeping better.")
    for q in CHAT + notebook_chat:
        assert any(s.lower() in q.lower() for s in BENCH_SUBJECTS), q  # the list names every measured subject
    questions = general_questions()
    assert len(questions) == len(set(questions)) >= 450
    # the first table's questions come first, so the shipped heads' recorded commands still ask the same ones
    first = {tpl.format(x) for tpl, subjects in GENERAL_QUESTIONS for x in subjects}
    assert set(questions[:len(first)]) == first
    for q in questions:
        assert not any(s.lower() in q.lower() for s in BENCH_SUBJECTS), q
    trained_functions = {sig.split("(")[0] for sig, _ in CODE_HEADS}
    for c in COMPLETE:
        assert not any(f"def {f}(" in c for f in trained_functions), c


def test_head_targets_hand_each_guess_the_base_state_that_ranked_it():
    # row t's head i must learn x_{t+i+1}, and (--distill, --feature-weight) the state h_{t+i} that ranked it
    from minillm.spec_decode.medusa_train import head_targets

    ids, plen, k = list(range(100, 112)), 4, 2
    h = torch.arange(len(ids), dtype=torch.float32)[:, None].repeat(1, 3)  # h_t = t in every lane
    hs, ys, nexts = head_targets([(ids, plen)], [h], k, with_next=True)
    t = hs[:, 0].long()
    assert t.tolist() == list(range(plen - 1, len(ids) - 1 - k))  # every generated position with all targets
    for i in range(k + 1):
        assert ys[:, i].tolist() == [ids[x + 1 + i] for x in t.tolist()]
    for i in range(k):
        assert nexts[:, i, 0].long().tolist() == (t + 1 + i).tolist()
    assert len(head_targets([(ids, plen)], [h], k)) == 2


def test_training_rejects_an_unknown_kind_before_generating():
    # the check comes before minutes of generation (no tokenizer is needed to fail)
    with pytest.raises(ValueError, match="kind must be one of"):
        train_heads(tiny_model(seed=1, vocab=VOCAB), None, [], MedusaTrainConfig(kind="eagle"))
    with pytest.raises(ValueError, match="feature_weight"):
        train_heads(tiny_model(seed=1, vocab=VOCAB), None, [], MedusaTrainConfig(feature_weight=-1.0))
    with pytest.raises(ValueError, match="answers_per_prompt"):
        train_heads(tiny_model(seed=1, vocab=VOCAB), None, [], MedusaTrainConfig(answers_per_prompt=0))
    with pytest.raises(ValueError, match="sample_temperature"):
        train_heads(tiny_model(seed=1, vocab=VOCAB), None, [],
                    MedusaTrainConfig(answers_per_prompt=2, sample_temperature=0.0))


def test_sampled_answers_follow_the_greedy_ones_and_are_reproducible():
    # seqs[j * P + i] is prompt i's answer j: answer 0 is the greedy one, the others sampled with a seed each
    from minillm.spec_decode.medusa_train import generate as own_generate

    model = tiny_model(seed=1, vocab=VOCAB)
    prompts = random_prompts(5, VOCAB, 3, 9, seed=2)
    greedy = own_generate(model, None, [], prompts, 12)
    seqs = own_generate(model, None, [], prompts, 12, answers_per_prompt=3, temperature=1.0, seed=5)
    assert len(seqs) == 15 and seqs[:5] == greedy
    for r, (ids, plen) in enumerate(seqs):
        assert plen == len(prompts[r % 5]) and ids[:plen] == prompts[r % 5]
    assert seqs == own_generate(model, None, [], prompts, 12, answers_per_prompt=3, temperature=1.0, seed=5)
    assert seqs[5:] != greedy + greedy  # sampled at temperature 1 from a random model: not the greedy text


@pytest.mark.parametrize("answers", [1, 3])
def test_held_out_prompts_keep_all_their_answers_out_of_training(answers):
    from minillm.spec_decode.medusa_train import split_by_prompt

    n = 40
    train, hold = split_by_prompt(n * answers, answers, 0.1, random.Random(3))
    assert len(hold) == 4 and all(i < n for i in hold)  # only greedy answers are scored
    assert not {i % n for i in train} & set(hold)  # no answer of a held-out prompt is trained on
    dropped = [j * n + i for j in range(1, answers) for i in hold]  # sampled answers to held-out prompts
    assert sorted(train + hold + dropped) == list(range(n * answers))


def fake_prompts(monkeypatch, n=6):
    """own_answers' prompts without a tokenizer: random token ids."""
    import minillm.spec_decode.medusa_train as mt

    monkeypatch.setattr(mt, "training_prompts", lambda tok, *counts: random_prompts(n, VOCAB, 3, 9, seed=2))


def test_answers_file_is_written_once_then_read_back_and_checked(tmp_path, monkeypatch):
    import minillm.spec_decode.medusa_train as mt
    from minillm.spec_decode.medusa_train import MedusaTrainReport, own_answers

    fake_prompts(monkeypatch)
    model = tiny_model(seed=1, vocab=VOCAB)
    path = tmp_path / "answers.json"
    cfg = MedusaTrainConfig(max_new_tokens=10, answers_per_prompt=2, answers_file=str(path))
    first = MedusaTrainReport({})
    seqs = own_answers(model, None, [], cfg, first, lambda s: None)
    assert path.is_file() and len(seqs) == 12 and first.generate_s > 0 and not first.answers_read

    def no_generation(*a, **k):
        raise AssertionError("generated again although the answers file exists")
    monkeypatch.setattr(mt, "generate", no_generation)
    again = MedusaTrainReport({})
    assert own_answers(model, None, [], cfg, again, lambda s: None) == seqs
    assert again.answers_read and again.generate_s == 0
    assert again.num_generated_tokens == first.num_generated_tokens
    # other settings, another base model, a damaged file: clear errors, never a silent reuse
    with pytest.raises(ValueError, match="max_new_tokens 10 in the file, 12 here"):
        own_answers(model, None, [], MedusaTrainConfig(max_new_tokens=12, answers_per_prompt=2, answers_file=str(path)),
                    MedusaTrainReport({}), lambda s: None)
    with pytest.raises(ValueError, match="another base model"):
        own_answers(tiny_model(seed=2, vocab=VOCAB), None, [], cfg, MedusaTrainReport({}), lambda s: None)
    path.write_text(path.read_text()[:100])
    with pytest.raises(ValueError, match="not a readable answers file"):
        own_answers(model, None, [], cfg, MedusaTrainReport({}), lambda s: None)
