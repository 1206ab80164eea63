"""EAGLE's draft layer: its cache against a whole-sequence pass, its guesses against a from-scratch recomputation
inside continuous batching (preemption, prefix hits, rejections), and greedy output unchanged."""
from __future__ import annotations

import pytest
import torch

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.sampling_params import SamplingParams
from minillm.spec_decode.eagle_layer import EagleCache, EagleLayer
from tests.helpers.engine_utils import random_prompts, run_to_completion, tiny_model
from minillm.spec_decode.medusa_train import final_hidden as forward_hidden

VOCAB = 31


def random_layer(model, seed=0, scale=0.15) -> EagleLayer:
    layer = EagleLayer(model.config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return layer.eval()


def test_cache_forgets_guesses_and_restarts_after_a_gap():
    c = EagleCache(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))
    k = torch.arange(5 * 4, dtype=torch.float32).view(1, 5, 4)
    keys, _ = c.append(k, k)  # grows past its capacity of 2
    assert c.end == 5 and torch.equal(keys, k)
    c.keep_until(3)  # positions 3 and 4 were guesses
    assert (c.start, c.length) == (0, 3)
    keys, _ = c.append(k[:, :1] + 100, k[:, :1])
    assert torch.equal(keys[:, :3], k[:, :3]) and torch.equal(keys[:, 3], k[:, 0] + 100)
    c.keep_until(9)  # positions 4..8 never seen (a prefix-cache hit): start over at 9
    assert (c.start, c.length, c.end) == (9, 0, 9)
    c.keep_until(2)  # before the start: start over there
    assert (c.start, c.end) == (2, 2)


def test_layer_in_pieces_equals_the_whole_sequence():
    model = tiny_model(seed=1, vocab=VOCAB)
    layer = random_layer(model)
    n, hid = 11, model.config.hidden_size
    h = torch.randn(n, hid)
    emb = torch.randn(n, hid)
    whole = layer(h[None], emb[None], model.rotary.lookup(torch.arange(n)))[0]
    cache = layer.new_cache(capacity=2)
    parts = []
    for a, b in ((0, 4), (4, 5), (5, 11)):
        parts.append(layer.extend(h[a:b], emb[a:b], model.rotary.lookup(torch.arange(a, b)), cache))
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-5, atol=1e-5)
    # a rejected guess at 9..10 replaced by other rows: the same as having run those rows first
    cache.keep_until(9)
    again = layer.extend(h[9:] * 0.5, emb[9:], model.rotary.lookup(torch.arange(9, 11)), cache)
    other = layer(torch.cat([h[:9], h[9:] * 0.5])[None], emb[None], model.rotary.lookup(torch.arange(n)))[0]
    torch.testing.assert_close(again, other[9:], rtol=1e-5, atol=1e-5)


def dense_guesses(model, layer, ids: list[int], k: int) -> list[int]:
    """The guesses from scratch: the target's features over the whole sequence, the layer over all of them
    in one pass, then k top-1 guesses, each fed back."""
    n = len(ids)
    h = forward_hidden(model, ids)
    cache = layer.new_cache()
    z = layer.extend(h[: n - 1], model.embed_tokens(torch.tensor(ids[1:])), model.rotary.lookup(torch.arange(n - 1)),
                     cache)[-1]
    out = []
    for d in range(k):
        g = int(model.compute_logits(z[None]).argmax(-1))
        out.append(g)
        z = layer.extend(z[None], model.embed_tokens(torch.tensor([g])), model.rotary.lookup(torch.tensor([n - 1 + d])),
                         cache)[0]
    return out


def generate(spec, num_blocks=256, prefix_caching=False, record=None):
    e = LLMEngine(tiny_model(seed=1, vocab=VOCAB), None, [], EngineConfig(
        block_size=4, num_kv_blocks=num_blocks, max_num_seqs=8, max_num_batched_tokens=24, speculative=spec,
        enable_prefix_caching=prefix_caching))
    if record is not None:
        inner = e.proposer.propose_tokens

        def propose_tokens(wants):
            props = inner(wants)
            record.extend((list(s.token_ids), p.token_ids) for (s, _), p in zip(wants, props) if p.token_ids)
            return props
        e.proposer.propose_tokens = propose_tokens
    params = SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True, stop_token_ids=[7])
    prompts = random_prompts(8, VOCAB, 3, 12, seed=4)
    for i, p in enumerate(prompts):
        e.add_request(str(i), prompts[0] * 2 + p if prefix_caching else p * 2, params)
    return run_to_completion(e), e


@pytest.mark.parametrize("num_blocks,prefix", [(256, False), (14, False), (256, True)])
def test_greedy_with_eagle_equals_greedy_and_each_guess_equals_a_recomputation(num_blocks, prefix):
    ref, _ = generate(None, prefix_caching=prefix)
    model = tiny_model(seed=1, vocab=VOCAB)
    layer = random_layer(model)
    record = []
    out, e = generate({"method": "eagle", "heads": layer, "num_tokens": 3}, num_blocks, prefix, record)
    assert out == ref
    recs = [r for s in e.trace for r in s.spec]
    assert sum(r.num_proposed for r in recs) > 0
    assert not e.proposer.caches and not e.proposer.feature  # nothing kept for finished sequences
    if num_blocks < 256:
        assert any(s.preemptions for s in e.trace)
    if not prefix:  # a prefix hit skips positions the layer never saw: its guesses read less (still exact output)
        assert len(record) > 20
        for ids, guesses in record:
            assert guesses == dense_guesses(model, layer, ids, len(guesses)), ids


def test_sampled_requests_keep_their_seeded_output():
    model = tiny_model(seed=1, vocab=VOCAB)

    def run(spec):
        e = LLMEngine(tiny_model(seed=1, vocab=VOCAB), None, [], EngineConfig(
            block_size=4, num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=64, speculative=spec))
        for i, p in enumerate(random_prompts(4, VOCAB, 3, 8, seed=2)):
            e.add_request(str(i), p, SamplingParams(temperature=0.8, max_tokens=10, ignore_eos=True, seed=i))
        return run_to_completion(e)

    # deterministic guesses (q one-hot) accepted with probability p(guess): the target's distribution holds
    # (tests/test_spec_rejection.py); here the engine must at least run sampled requests to the end
    out = run({"method": "eagle", "heads": random_layer(model), "num_tokens": 2})
    assert sorted(out) == ["0", "1", "2", "3"] and all(len(v) == 10 for v in out.values())


def test_layer_file_round_trip_and_errors(tmp_path):
    from minillm.spec_decode.medusa_heads import MedusaHeads

    model = tiny_model(seed=1, vocab=VOCAB)
    layer = random_layer(model)
    path = tmp_path / "eagle.safetensors"
    layer.save(path, base_model="tiny")
    back = EagleLayer.load(path, model.config)
    for (n, a), (_, b) in zip(layer.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), n
    assert back.metadata["base_model"] == "tiny"
    other = tiny_model(seed=1, vocab=VOCAB, heads=2)
    with pytest.raises(ValueError, match="shape"):
        EagleLayer.load(path, other.config)
    heads = tmp_path / "medusa.safetensors"
    MedusaHeads(model.config.hidden_size, 2).save(heads)
    with pytest.raises(ValueError, match="not an EAGLE layer"):
        EagleLayer.load(heads, model.config)
    with pytest.raises(FileNotFoundError, match="train-eagle"):
        EagleLayer.load(tmp_path / "missing.safetensors", model.config)
    with pytest.raises(ValueError, match="tree applies"):
        LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=16, speculative={
            "method": "eagle", "heads": layer, "tree": [2, 1]}))


@pytest.mark.default_model
@pytest.mark.slow
def test_training_teaches_the_layer_the_default_models_own_continuations(default_model):
    # a short run of the real recipe (train_eagle: its own greedy answers, frozen base; a random tiny
    # model's greedy text only repeats one token): the first guess's held-out top-1 must beat the untrained
    # layer's (which repeats the LM head's guess for x_{p+1}). No loss is asked to fall: over 36 steps the first
    # and last batches' losses depend on which batches they were, and the held-out loss (soft labels plus the
    # feature term) measured 12.0 untrained and 14.7 trained while top-1 went from 0.01 to 0.14
    from minillm.spec_decode.eagle_train import EagleTrainConfig, train_eagle
    from minillm.spec_decode.medusa import embedding_fingerprint

    m = default_model
    cfg = EagleTrainConfig(num_chat_prompts=8, num_topic_questions=0, num_general_questions=32, max_new_tokens=40,
                           epochs=3, batch_sequences=4, lr=2e-3, noise=0.2, holdout=0.2)
    layer, report = train_eagle(m.model, m.tokenizer, m.eos_token_ids, cfg, log=lambda s: None)
    assert report.num_train_positions > 400 and report.steps > 20
    assert 0 < report.holdout_loss < float("inf") and 0 < report.holdout_untrained_loss < float("inf")
    assert layer.metadata["base_fingerprint"] == embedding_fingerprint(m.model)
    assert report.holdout_top1 > report.holdout_untrained_top1 + 0.1, (report.holdout_top1,
                                                                       report.holdout_untrained_top1)
    assert not any(p.requires_grad for p in m.model.parameters())


def test_eagle_needs_a_layer():
    from minillm.bench.spec import Proposer
    from minillm.spec_decode.speculative_config import parse_speculative

    with pytest.raises(ValueError, match="needs heads"):
        parse_speculative({"method": "eagle", "num_tokens": 2})
    with pytest.raises(ValueError, match="eagle:FILE"):
        Proposer("eagle").speculative
    assert Proposer("eagle:x.safetensors@4096").speculative == {"method": "eagle", "heads": "x.safetensors",
                                                               "num_tokens": 1, "draft_vocab": 4096}
    assert Proposer("eagle:x.safetensors").is_medusa
    model = tiny_model(seed=1, vocab=VOCAB)
    with pytest.raises(ValueError, match="needs an EAGLE layer"):
        from minillm.spec_decode.medusa_heads import MedusaHeads

        LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=16, speculative={
            "method": "eagle", "heads": MedusaHeads(model.config.hidden_size, 1)}))


@pytest.mark.default_model
@pytest.mark.slow
@pytest.mark.parametrize("num_blocks", [None, 9])
def test_greedy_with_eagle_equals_greedy_on_the_default_model(default_model, num_blocks):
    # no layer ships (README): an untrained one (it guesses the LM head's x_{p+1} again) and a random one,
    # in a continuous batch, with preemption when the pool has 9 blocks
    from tests.test_spec_greedy import MAX_TOKENS, engine, prompts, run

    tok = default_model.tokenizer
    reference = run(engine(default_model), prompts(tok), MAX_TOKENS)
    torch.manual_seed(0)
    for layer in (EagleLayer(default_model.model.config), random_layer(default_model.model, scale=0.02)):
        e = engine(default_model, {"method": "eagle", "heads": layer, "num_tokens": 2, "draft_vocab": 4096},
                   num_blocks)
        assert run(e, prompts(tok), MAX_TOKENS) == reference
        assert sum(r.num_proposed for s in e.trace for r in s.spec) > 0
        assert not e.proposer.caches
        if num_blocks:
            assert sum(len(s.preemptions) for s in e.trace) > 0


@pytest.mark.parametrize("bad", [{"noise": -0.1}, {"feature_weight": float("nan")}, {"epochs": 0}])
def test_training_rejects_bad_settings_before_generating(bad):
    from minillm.spec_decode.eagle_train import EagleTrainConfig, train_eagle

    def no_generation(*a, **k):
        raise AssertionError("generated before checking the settings")
    with pytest.raises(ValueError, match="must be >= "):
        train_eagle(tiny_model(seed=1, vocab=VOCAB), None, [], EagleTrainConfig(**bad), log=no_generation)
