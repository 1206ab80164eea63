"""A draft whose LM head keeps only frequent tokens (spec_decode/draft_vocab.py): the kept rows hold the
same blocks and score as in the full head (up to summation order: fewer rows can take another kernel),
every other id is -inf, and speculative output stays the target's."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from minillm.cpu.kernels import gguf_cpu
from minillm.spec_decode.draft_vocab import RestrictedLMHead, frequent_tokens, reference_corpus, restrict_lm_head
from tests.test_gguf_cpu_kernels import random_blocks

OK, WHY = gguf_cpu.available()


@pytest.mark.skipif(not OK, reason=f"GGUF CPU kernels unavailable: {WHY}")
@pytest.mark.parametrize("types", [("Q8_0",), ("Q4_K",), ("Q6_K",), ("Q4_K", "Q6_K", "Q8_0")])
def test_select_rows_scores_the_kept_rows_exactly(types):
    """Interleaved (Q8_0, Q4_K) and row-by-row (Q6_K) layouts, and rows spread over several parts."""
    from minillm.quant.gguf_linear import GGUFLinear

    k = 256
    parts = [(t, torch.from_numpy(random_blocks(t, 24, k, seed=i))) for i, t in enumerate(types)]
    full = GGUFLinear(k, parts)
    rows = torch.tensor(sorted({0, 3, 7, 8, 15, 23} | {24 * len(types) - 1, 24 * (len(types) - 1) + 5}))
    sub = full.select_rows(rows)
    x = torch.randn(3, k)
    torch.testing.assert_close(sub(x), full(x)[:, rows], rtol=1e-5, atol=1e-5)
    assert torch.equal(sub.dequantized_weight(), full.dequantized_weight()[rows])
    with pytest.raises(ValueError, match="ascending"):
        full.select_rows(torch.tensor([5, 3]))
    with pytest.raises(ValueError, match="ascending"):
        full.select_rows(torch.tensor([24 * len(types)]))


def test_restricted_head_is_minus_inf_outside_and_equal_inside():
    from minillm.config import ModelConfig
    from minillm.models.llama import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    h = torch.randn(5, 32)
    before = model.compute_logits(h)
    ids = torch.tensor([0, 2, 3, 50, 95])
    head = restrict_lm_head(model, ids)
    after = model.compute_logits(h)
    assert isinstance(model.lm_head, RestrictedLMHead) and head.token_ids.tolist() == ids.tolist()
    torch.testing.assert_close(after[:, ids], before[:, ids], rtol=1e-5, atol=1e-5)
    keep = torch.zeros(96, dtype=torch.bool)
    keep[ids] = True
    assert torch.isinf(after[:, ~keep]).all() and (after[:, ~keep] < 0).all()
    assert model.embed_tokens.weight.shape[0] == 96  # the tied table stays whole for the input gather
    assert restrict_lm_head(model, ids) is head  # the same draft passed to a second engine
    with pytest.raises(ValueError, match="already keeps"):
        restrict_lm_head(model, ids[:3])


@pytest.mark.parametrize("width", [1, 2, 3])
def test_top_tokens_on_the_kept_rows_equal_ranking_the_whole_row(width):
    """RestrictedLMHead.top_tokens ranks only the kept scores: the same ids, best first, as top_tokens over
    the vocabulary-wide row with -inf elsewhere, ties included (a kept id repeated on purpose: the first
    maximum wins in both)."""
    from minillm.engine.sampler import top_tokens

    torch.manual_seed(1)
    ids = torch.tensor([1, 4, 9, 10, 30, 63])
    head = RestrictedLMHead(nn.Linear(16, ids.numel(), bias=False), ids, 64)
    with torch.no_grad():  # kept rows 1 and 3 (ids 4 and 10) score alike and lead on an all-ones input
        head.head.weight.mul_(0.01)
        head.head.weight[1] = 1.0
        head.head.weight[3] = 1.0
    x = torch.ones(7, 16)
    x[1:] = torch.randn(6, 16)
    with torch.no_grad():
        fast, slow = head.top_tokens(x, width), top_tokens(head(x), width)
    assert fast.shape == (7, width) and fast.dtype == torch.long
    assert torch.isin(fast, ids).all()
    if width == 1:
        assert torch.equal(fast, slow)
        assert fast[0, 0] == 4  # the tie on row 0 goes to the first maximum
    else:  # topk's order among equal scores is unspecified: compare the ranked scores and the sets
        full = head(x)
        torch.testing.assert_close(full.gather(1, fast), full.gather(1, slow))
        assert all(set(a) == set(b) for a, b in zip(fast[1:].tolist(), slow[1:].tolist()))


def test_frequent_tokens_counts_the_corpus():
    class Chars:  # a tokenizer over characters: ids are code points below 128
        all_special_ids = [0]

        def __call__(self, docs, add_special_tokens=False):
            return {"input_ids": [[ord(c) for c in d if ord(c) < 128] for d in docs]}

    docs = ["aaaaab", "bbbba", "cccd", "de"]  # a 6, b 5, c 3, d 2, e 1; then unseen ids 1, 2, ... (count 0)
    ids = frequent_tokens(Chars(), 128, 3, docs=docs)
    # the special id 0, the 3 most frequent, topped up to 8 rows with d, e and the lowest unseen ids
    assert ids.tolist() == [0, 1, 2, ord("a"), ord("b"), ord("c"), ord("d"), ord("e")]
    assert frequent_tokens(Chars(), 128, 7, docs=docs).tolist() == ids.tolist()
    assert len(frequent_tokens(Chars(), 128, 8, docs=docs)) == 16
    assert len(frequent_tokens(Chars(), 12, 12, docs=["ab"])) == 12  # never more than the vocabulary
    with pytest.raises(ValueError, match="draft_vocab"):
        frequent_tokens(Chars(), 128, 0, docs=["a"])
    docs = reference_corpus(max_chars=200_000)
    assert sum(map(len, docs)) == 200_000 and any("def " in d for d in docs) and len(docs) > 4


def test_draft_vocab_is_validated():
    from minillm.spec_decode.speculative_config import parse_speculative

    with pytest.raises(ValueError, match="separate draft model"):
        parse_speculative({"method": "ngram", "draft_vocab": 100})
    with pytest.raises(ValueError, match="separate draft model"):
        parse_speculative({"method": "draft", "model": "int4", "draft_vocab": 100})
    with pytest.raises(ValueError, match="integer >= 1"):
        parse_speculative({"method": "draft", "model": "x.gguf", "draft_vocab": 0})
    assert parse_speculative({"method": "draft", "model": "x.gguf", "draft_vocab": 8}).draft_vocab == 8
    assert parse_speculative({"method": "medusa", "draft_vocab": 8}).draft_vocab == 8  # ranks the heads' guesses


def test_a_restricted_draft_keeps_greedy_output_and_proposes_only_kept_tokens():
    """The target's own weights as the draft, its head cut to the even ids: greedy output equals plain
    decoding, every guess is even, and guesses are accepted (sampling: test_spec_distribution's
    draft_model_vocab case)."""
    from tests.test_spec_draft_model import VOCAB, generate, target

    draft = target()
    restrict_lm_head(draft, torch.arange(0, VOCAB, 2))
    out, e = generate({"method": "draft", "model": draft, "num_tokens": 3})
    assert out == generate(None)[0]
    recs = [r for s in e.trace for r in s.spec]
    guesses = [t for r in recs for t in r.draft_token_ids]
    assert guesses and all(t % 2 == 0 for t in guesses)
    assert 0 < sum(r.num_accepted for r in recs) < len(guesses)  # the odd tokens it cannot guess are rejected
    assert e.proposer.bm.num_free_blocks == e.proposer.bm.num_blocks



@pytest.mark.skipif(not OK, reason=f"GGUF CPU kernels unavailable: {WHY}")
def test_float_as_q8_0_rounds_each_block_to_its_own_scale():
    """llama.cpp's Q8_0: per 32 weights d = max|w| / 127, codes round(w / d); a zero block stays zero."""
    from minillm.quant.cpu_route import float_as_q8_0
    from minillm.quant.gguf_linear import GGUFLinear

    torch.manual_seed(2)
    w = torch.randn(24, 96) * torch.logspace(-3, 1, 24)[:, None]  # rows on very different scales
    w[5, 32:64] = 0.0
    lin = GGUFLinear(96, [("Q8_0", float_as_q8_0(w))])
    back = lin.dequantized_weight()
    d = w.reshape(24, 3, 32).abs().amax(-1, keepdim=True) / 127
    err = (back - w).reshape(24, 3, 32).abs()
    stored = d.half().float()  # d is kept as fp16; the codes were rounded against the float d
    assert (err <= 0.5 * d + 127 * (d - stored).abs() + 1e-7).all()  # half a step, plus d's fp16 rounding
    assert torch.equal(back[5, 32:64], torch.zeros(32))
    x = torch.randn(3, 96)
    torch.testing.assert_close(lin(x), x @ back.t(), rtol=2e-2, atol=2e-2 * float(x.abs().max() * back.abs().sum(1).max()))
    with pytest.raises(ValueError, match="multiple of 32"):
        float_as_q8_0(torch.randn(4, 40))


@pytest.mark.skipif(not OK, reason=f"GGUF CPU kernels unavailable: {WHY}")
def test_a_float_cpu_ranking_head_is_stored_as_q8_0(monkeypatch):
    """The cut copy that ranks Medusa/Hydra/EAGLE guesses: Q8_0 blocks for a float32 CPU head (it only
    ranks; the target verifies), its scores within Q8_0's error of the float rows; float where asked
    (MINILLM_RANKING_HEAD=float) and where Q8_0 does not apply (bf16, K not a multiple of 32)."""
    from minillm.quant.gguf_linear import GGUFLinear
    from minillm.spec_decode.draft_vocab import RANKING_HEAD_ENV, q8_0_ranking_head, restricted_head

    torch.manual_seed(3)
    head = nn.Linear(64, 200, bias=False)
    ids = torch.tensor([0, 7, 8, 50, 199])
    assert q8_0_ranking_head(head)
    cut = restricted_head(head, ids, 200, q8_0=True)
    assert isinstance(cut.head, GGUFLinear) and cut.head.out_features == ids.numel()
    x = torch.randn(4, 64)
    with torch.no_grad():
        exact = x @ head.weight[ids].t()
        torch.testing.assert_close(cut.head(x), exact, rtol=0, atol=0.03 * float(exact.abs().max()))
        assert torch.isin(cut.top_tokens(x, 2), ids).all()
    monkeypatch.setenv(RANKING_HEAD_ENV, "float")
    assert not q8_0_ranking_head(head)
    monkeypatch.delenv(RANKING_HEAD_ENV)
    assert not q8_0_ranking_head(nn.Linear(64, 200).bfloat16())
    assert not q8_0_ranking_head(nn.Linear(48, 200))
    assert type(restricted_head(head, ids, 200).head) is nn.Linear  # the default copy keeps the head's class
