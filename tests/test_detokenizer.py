"""Incremental detokenization, stop strings and min_tokens (minillm/engine/detokenizer.py),
and the sampler's token bans for min_tokens (minillm/engine/sampler.py).

The reference for text is always the full decode: tokenizer.decode(output_ids, ...).
"""
from __future__ import annotations

import random

import pytest
import torch

from minillm.engine.detokenizer import IncrementalDetokenizer
from minillm.engine.sampler import ban_tokens, min_tokens_bans
from minillm.sampling_params import SamplingParams

EMOJI_TEXT = "héllo 😀 世界 ∑ 🤗🦀 ñ ü ß 日本語 👩‍👩‍👧"


def feed(tok, ids: list[int], **params) -> tuple[IncrementalDetokenizer, list[str], list[str | None]]:
    """Append ids one by one; returns the detokenizer, every visible_text(False), every append result."""
    d = IncrementalDetokenizer(tok, [1, 2, 3], SamplingParams(**params))
    visible, stops = [], []
    for t in ids:
        stops.append(d.append(t))
        visible.append(d.visible_text(False))
    return d, visible, stops


def assert_prefixes(visible: list[str], final: str) -> None:
    for i, v in enumerate(visible):
        assert final.startswith(v), (i, v, final)


# ----- the default model's tokenizer (byte-level BPE) ---------------------------------
@pytest.fixture(scope="module")
def tok(default_model):
    return default_model.tokenizer


def random_outputs(tok, count: int, seed: int) -> list[list[int]]:
    """Seeded id sequences mixing any token, tokens that end halfway through a UTF-8
    character (decode alone to U+FFFD), the pieces of emoji / CJK text, special tokens."""
    vocab = len(tok)
    partial = [i for i in range(vocab) if tok.decode([i]).endswith("\ufffd")]
    assert len(partial) > 100  # the byte-level vocabulary has many
    pieces = tok.encode(EMOJI_TEXT, add_special_tokens=False)
    special = list(tok.all_special_ids) + [3, 5, 16]
    r = random.Random(seed)
    kinds = [
        lambda: [r.randrange(vocab)],
        lambda: [r.choice(partial)],
        lambda: [r.choice(special)],
        lambda: pieces[(i := r.randrange(len(pieces))) : i + r.randrange(1, 6)],
    ]
    return [[t for _ in range(r.randrange(1, 60)) for t in r.choice(kinds)()] for _ in range(count)]


@pytest.mark.default_model
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_text_equals_full_decode_after_every_token(tok, skip_special_tokens):
    for ids in random_outputs(tok, 150, seed=int(skip_special_tokens)):
        d = IncrementalDetokenizer(tok, [], SamplingParams(skip_special_tokens=skip_special_tokens))
        visible = []
        for i, t in enumerate(ids):
            assert d.append(t) is None
            assert d.text == tok.decode(ids[: i + 1], skip_special_tokens=skip_special_tokens), (ids, i)
            visible.append(d.visible_text(False))
            assert not visible[-1].endswith("\ufffd")
        assert d.text == tok.decode(ids, skip_special_tokens=skip_special_tokens)
        assert d.visible_text(True) == d.text
        assert_prefixes(visible, d.text)


@pytest.mark.default_model
def test_emoji_text_streams_whole_characters(tok):
    ids = tok.encode(EMOJI_TEXT, add_special_tokens=False)
    assert len(ids) > len(EMOJI_TEXT.split())  # characters really are split over tokens
    d, visible, _ = feed(tok, ids + [tok.eos_token_id])
    assert d.text == EMOJI_TEXT  # EOS is a special token: skipped
    assert all("\ufffd" not in v for v in visible)
    assert_prefixes(visible, d.text)
    # a stream sends the growing visible text as deltas: they add up to the text
    sent = ""
    for v in visible + [d.visible_text(True)]:
        assert v.startswith(sent)
        sent += v[len(sent) :]
    assert sent == EMOJI_TEXT


@pytest.mark.default_model
def test_special_tokens_kept_or_skipped(tok):
    ids = tok.encode("Hi there", add_special_tokens=False)
    out = [tok.convert_tokens_to_ids("<|im_start|>")] + ids + [tok.convert_tokens_to_ids("<|im_end|>")]
    assert feed(tok, out, skip_special_tokens=True)[0].text == "Hi there"
    assert feed(tok, out, skip_special_tokens=False)[0].text == "<|im_start|>Hi there<|im_end|>"


def colon_p(tok, text: str) -> list[int]:
    """One token per character of a text made of ':' and 'P'."""
    ids = [tok.convert_tokens_to_ids(c) for c in text]
    assert tok.decode(ids) == text and len(ids) == len(text)
    return ids


@pytest.mark.default_model
def test_stop_string_spanning_two_tokens_is_cut_and_never_shown(tok):
    ids = colon_p(tok, ":::::::PPPP")
    d, visible, stops = feed(tok, ids, stop=[":P"], max_tokens=None)
    assert stops == [None] * 7 + [":P"] + [None] * 3  # found by the token that completes it
    assert d.text == "::::::" and d.stop_string == ":P"
    assert max(len(v) for v in visible) == 6  # the 7th ':' (the stop's start) was never shown
    assert_prefixes(visible, "::::::")
    assert d.visible_text(True) == "::::::"


@pytest.mark.default_model
def test_stop_string_first_occurrence_wins(tok):
    ids = tok.encode("Hello world, dear friend", add_special_tokens=False)
    d, visible, stops = feed(tok, ids, stop=["friend", "world", "lo w"], max_tokens=None)
    assert d.text == "Hel" and d.stop_string == "lo w"  # 'world' is listed first but starts later
    assert stops.count("lo w") == 1 and stops[-1] is None  # later tokens are ignored after the stop
    assert_prefixes(visible, d.text)


@pytest.mark.default_model
def test_stop_string_that_is_one_multibyte_character(tok):
    ids = tok.encode("ok 😀 more", add_special_tokens=False)
    d, visible, stops = feed(tok, ids, stop=["😀"], max_tokens=None)
    assert d.text == "ok " and "😀" in stops
    assert_prefixes(visible, d.text)


@pytest.mark.default_model
@pytest.mark.parametrize(
    "text, min_tokens, final",
    [
        (":::::::PPPP", 0, "::::::"),
        (":::::::PPPP", 6, "::::::"),  # the cut may land exactly on min_tokens' text
        (":::::::PPPP", 7, ":::::::PPPP"),  # it would cut into the first 7 tokens: ignored
        (":::::::PPPP", 8, ":::::::PPPP"),  # completed with token 8 but starts before: ignored
        (":::P::P:P", 4, ":::P:"),  # the first ':P' came too early, the next one counts
        (":::P::P:P", 5, ":::P:"),
        (":::P::P:P", 6, ":::P::P"),
    ],
)
def test_min_tokens_stop_never_cuts_into_the_first_tokens(tok, text, min_tokens, final):
    d, visible, _ = feed(tok, colon_p(tok, text), stop=[":P"], min_tokens=min_tokens, max_tokens=None)
    assert d.text == final
    assert len(d.text) >= min_tokens  # one character per token here
    assert_prefixes(visible, d.text)


@pytest.mark.default_model
def test_visible_text_holds_back_a_possible_stop_start(tok):
    ids = tok.encode("one two three", add_special_tokens=False)
    d, visible, _ = feed(tok, ids, stop=["xyzzy"], max_tokens=None)
    assert d.text == "one two three"
    assert visible[-1] == "one two t"  # 4 = len('xyzzy') - 1 characters held back
    assert feed(tok, ids)[1][-1] == "one two three"  # no stop strings: nothing held back


def test_without_tokenizer_there_is_no_text():
    d = IncrementalDetokenizer(None, [1], SamplingParams(stop=["a"]))
    assert [d.append(t) for t in (5, 6, 7)] == [None, None, None]
    assert d.text == "" and d.visible_text(False) == "" and d.visible_text(True) == ""
    assert d.token_ids == [5, 6, 7]


# ----- a sentencepiece-style decoder (Llama 2 / Mistral), built in memory -------------
@pytest.fixture(scope="module")
def spm_tok():
    """Metaspace pieces, byte fallback and 'strip the first space': decoding a piece
    alone is not a slice of decoding it in context, unlike byte-level BPE."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "▁▁", "▁Hello", "▁world", "Hello", "a", "▁a", ".", ",", "é"]
    model = models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[], byte_fallback=True, unk_token="<unk>")
    backend = Tokenizer(model)
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_sentencepiece_style_text_equals_full_decode(spm_tok, skip_special_tokens):
    words = list(range(259, len(spm_tok)))  # the pieces after the byte tokens
    chars = [[3 + b for b in c.encode()] for c in "é😀世a"]  # whole characters as byte tokens
    r = random.Random(0)
    for _ in range(400):
        ids = []
        for _ in range(r.randrange(1, 25)):
            ids += r.choice([lambda: [r.choice(words)], lambda: r.choice(chars), lambda: [r.choice([1, 2, 259])]])()
        d = IncrementalDetokenizer(spm_tok, [], SamplingParams(skip_special_tokens=skip_special_tokens))
        visible = []
        for i, t in enumerate(ids):
            d.append(t)
            assert d.text == spm_tok.decode(ids[: i + 1], skip_special_tokens=skip_special_tokens), (ids, i)
            visible.append(d.visible_text(False))
        assert_prefixes(visible, d.text)


def test_invalid_utf8_bytes_still_give_the_full_decode_text(spm_tok):
    """Byte-fallback tokens that are no valid UTF-8 together turn *earlier* text into
    U+FFFD ('#' then 0x80 decodes to two U+FFFD): decoding is not local there, the
    detokenizer notices and decodes the whole output for that step."""
    hash_, x80 = 3 + ord("#"), 3 + 0x80
    assert spm_tok.decode([hash_]) == "#" and spm_tok.decode([hash_, x80]) == "\ufffd\ufffd"
    r = random.Random(1)
    for _ in range(300):
        ids = [r.choice([r.randrange(3, 259), r.randrange(259, len(spm_tok)), 2]) for _ in range(r.randrange(1, 25))]
        d = IncrementalDetokenizer(spm_tok, [], SamplingParams())
        for i, t in enumerate(ids):
            d.append(t)
            assert d.text == spm_tok.decode(ids[: i + 1], skip_special_tokens=True), (ids, i)


def test_sentencepiece_space_survives_skipped_special_tokens(spm_tok):
    hello, world, eos = (spm_tok.convert_tokens_to_ids(p) for p in ("▁Hello", "▁world", "</s>"))
    d, _, _ = feed(spm_tok, [hello, eos, eos, world])
    assert d.text == "Hello world" == spm_tok.decode([hello, eos, eos, world], skip_special_tokens=True)


# ----- min_tokens in the sampler: ban EOS and stop_token_ids ----------------------------
def test_min_tokens_bans():
    p = SamplingParams(min_tokens=3, stop_token_ids=[7, 2])
    assert min_tokens_bans(p, 0, {2, 5}) == [2, 5, 7]
    assert min_tokens_bans(p, 2, {2, 5}) == [2, 5, 7]  # the 3rd token may not end the output
    assert min_tokens_bans(p, 3, {2, 5}) == []
    assert min_tokens_bans(SamplingParams(min_tokens=3, ignore_eos=True, stop_token_ids=[7]), 1, {2}) == [7]
    assert min_tokens_bans(SamplingParams(min_tokens=0), 0, {2}) == []
    assert min_tokens_bans(SamplingParams(min_tokens=2), 0, set()) == []


def test_ban_tokens_masks_each_row():
    logits = torch.randn(3, 10)
    before = logits.clone()
    out = ban_tokens(logits, [[1, 4], [], [9, 99, -1]])  # 99 and -1 are not in the vocabulary
    assert out is logits
    inf = float("-inf")
    assert out[0, 1] == inf and out[0, 4] == inf and out[2, 9] == inf
    expect = before.clone()
    expect[0, [1, 4]] = inf
    expect[2, 9] = inf
    assert torch.equal(out, expect)
    assert out[0].argmax() not in (1, 4)


def test_ban_tokens_without_bans_is_free():
    class NoTensorOps(torch.Tensor):  # any tensor op on it would go through __torch_function__
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            raise AssertionError(f"tensor op {func} on the no-ban path")

    logits = torch.randn(4, 8).as_subclass(NoTensorOps)
    assert ban_tokens(logits, [[], [], [], []]) is logits
