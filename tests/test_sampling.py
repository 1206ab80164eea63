"""Sampling: filters keep the right tokens, seeds reproduce, stop conditions and logprobs work."""
import math

import pytest
import torch

from minillm import SamplingParams
from minillm.engine.sampler import filter_logits, greedy_tokens, sample
from tests.helpers.engine_utils import make_engine, run_to_completion, tiny_model


def test_greedy_is_argmax():
    logits = torch.randn(5, 50)
    res = sample(logits, [SamplingParams(temperature=0)] * 5, [None] * 5)
    assert res.token_ids == logits.argmax(-1).tolist()


def test_greedy_tokens_follow_argmax_on_ties_nans_and_shapes():
    """greedy_tokens is max(-1).indices (faster on the CPU); it must pick what argmax picks."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0],  # a tie: the first maximum
                           [float("nan"), 1.0, float("nan"), 0.0],  # a NaN counts as the maximum
                           [-1.0, -1.0, -1.0, -1.0],
                           [0.0, 0.0, 0.0, 5.0]])
    assert greedy_tokens(logits).tolist() == logits.argmax(-1).tolist() == [1, 0, 0, 3]
    assert greedy_tokens(logits, keepdim=True).shape == (4, 1)
    assert int(greedy_tokens(logits[0])) == 1  # one row, no batch dimension
    wide = torch.randn(16, 49152, generator=torch.Generator().manual_seed(0)).round(decimals=1)  # many ties
    assert torch.equal(greedy_tokens(wide), wide.argmax(-1))


def test_top_k_top_p_min_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    keep = lambda p: (filter_logits(logits, [p])[0] > float("-inf")).tolist()
    assert keep(SamplingParams(top_k=2)) == [True, True, False, False]
    assert keep(SamplingParams(top_p=0.8)) == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    assert keep(SamplingParams(top_p=0.81)) == [True, True, True, False]
    assert keep(SamplingParams(top_p=0.1)) == [True, False, False, False]
    assert keep(SamplingParams(min_p=0.25)) == [True, True, True, False]  # floor 0.125


def test_an_unfiltered_row_keeps_every_token_when_batched_with_a_filtered_one():
    # top_p=1.0 is "off": a float32 cumsum reaches 1.0 before a long tail ends, and that must not
    # drop the tail of a row that asked for no filter because another row of the batch asked for one
    logits = torch.randn(2, 49152, generator=torch.Generator().manual_seed(0)) * 8
    out = filter_logits(logits, [SamplingParams(), SamplingParams(top_p=0.9)])
    assert bool(torch.isfinite(out[0]).all())
    assert not bool(torch.isfinite(out[1]).all())  # the filtered row really was filtered
    alone = filter_logits(logits[:1], [SamplingParams()])
    assert torch.equal(out[0], alone[0])


def test_sampling_frequencies_follow_the_distribution():
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    logits = probs.log().repeat(4000, 1)
    gen = torch.Generator().manual_seed(0)
    res = sample(logits, [SamplingParams(temperature=1.0)] * 4000, [gen] * 4000)
    freq = torch.bincount(torch.tensor(res.token_ids), minlength=4).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03), freq


def test_temperature_sharpens():
    logits = torch.tensor([[2.0, 1.0, 0.0]]).repeat(3000, 1)
    cold = sample(logits, [SamplingParams(temperature=0.2)] * 3000, [None] * 3000).token_ids
    hot = sample(logits, [SamplingParams(temperature=5.0)] * 3000, [None] * 3000).token_ids
    assert cold.count(0) > hot.count(0) + 1000


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_seed_reproducible_regardless_of_batch(model):
    p = SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    eng = make_engine(model)
    eng.add_request("alone", [3, 4, 5], p)
    alone = run_to_completion(eng)["alone"]
    eng = make_engine(model)
    for i in range(5):
        eng.add_request(f"noise{i}", [i + 1] * (i + 2), SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True))
    eng.add_request("seeded", [3, 4, 5], p)
    assert run_to_completion(eng)["seeded"] == alone
    eng = make_engine(model)
    eng.add_request("other", [3, 4, 5], SamplingParams(temperature=1.0, seed=99, max_tokens=12, ignore_eos=True))
    assert run_to_completion(eng)["other"] != alone


def test_stop_token_ids_and_logprobs(model):
    eng = make_engine(model)
    eng.add_request("r", [3, 4, 5], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    full = run_to_completion(eng)["r"]
    stop_at = full[4]
    first = full.index(stop_at)
    eng = make_engine(model)
    eng.add_request("r", [3, 4, 5], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at], logprobs=3))
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
    final = outs[-1].outputs[0]
    assert final.token_ids == full[: first + 1] and final.finish_reason == "stop" and final.stop_reason == stop_at
    assert len(final.logprobs) == len(final.token_ids)
    for tok, lp in zip(final.token_ids, final.logprobs):
        assert tok in lp and len(lp) >= 3
        assert max(lp.values()) == pytest.approx(lp[tok])  # greedy picks the most likely
        assert all(v <= 0 for v in lp.values()) and math.isfinite(lp[tok])
