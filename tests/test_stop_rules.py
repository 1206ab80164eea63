"""Stop strings and min_tokens on the real default model, end to end through the engine.

- A stream never yields text the final output does not contain (a stop string
  that spans tokens is held back until it can no longer complete).
- min_tokens bans EOS (and stop token ids) in sampling until it is reached,
  as vLLM does, so the output never carries an EOS token before it.
- A stop string that occurred before min_tokens never cuts the output below it.
"""
from __future__ import annotations

import pytest

from minillm import LLM, SamplingParams

pytestmark = [pytest.mark.default_model, pytest.mark.slow]

PROMPT = "List the days of the week, separated by commas:"


@pytest.fixture(scope="module")
def llm():
    with LLM(max_num_seqs=4, num_kv_blocks=64) as llm:
        yield llm


def greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0, **kw)


def token_texts(llm, ids: list[int]) -> list[str]:
    """The text each token adds (decoded cumulatively, so multi-byte characters land somewhere)."""
    tok = llm.tokenizer
    out, prev = [], ""
    for i in range(1, len(ids) + 1):
        cur = tok.decode(ids[:i], skip_special_tokens=True)
        out.append(cur[len(prev):])
        prev = cur
    return out


def test_stream_never_yields_what_a_stop_string_cuts(llm):
    ids = llm.generate(PROMPT, greedy(max_tokens=24, ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids
    pieces = token_texts(llm, ids)
    text = "".join(pieces)
    # a two-character stop string made of the last character of one token and the first of the next
    for i in range(2, len(pieces) - 1):
        a, b = pieces[i], pieces[i + 1]
        if a and b and a[-1] != "\ufffd" and b[0] != "\ufffd":
            stop = a[-1] + b[0]
            at = text.find(stop)
            if at == len("".join(pieces[: i + 1])) - 1:  # its first occurrence is the one spanning i, i + 1
                break
    else:
        pytest.fail(f"no token boundary to build a stop string on in {text!r}")
    params = greedy(max_tokens=24, ignore_eos=True, stop=[stop])
    final = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].text
    assert final == text[:at]
    streamed = ""
    for piece in llm.stream(PROMPT, params):
        streamed += piece
        assert final.startswith(streamed), f"stream yielded {streamed!r}, but the final text is {final!r}"
    assert streamed == final


def test_min_tokens_bans_eos_until_reached(llm):
    prompt = llm.apply_chat_template([{"role": "user", "content": "Answer with one word: is water wet?"}])
    short = llm.generate(prompt, greedy(max_tokens=32), use_tqdm=False)[0].outputs[0]
    assert short.finish_reason == "stop" and len(short.token_ids) < 12, "the model should stop early on its own"
    eos = set(llm.loaded.eos_token_ids)
    want = len(short.token_ids) + 4
    out = llm.generate(prompt, greedy(max_tokens=32, min_tokens=want), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) >= want
    assert not eos & set(out.token_ids[:want]), f"EOS sampled before min_tokens={want}: {out.token_ids}"
    # the same for a stop token id (here: the first token the model chose on its own)
    first = short.token_ids[0]
    out = llm.generate(prompt, greedy(max_tokens=8, min_tokens=3, stop_token_ids=[first]), use_tqdm=False)[0].outputs[0]
    assert first not in out.token_ids[:3] and len(out.token_ids) >= 3


def test_stop_string_before_min_tokens_does_not_cut_below_it(llm):
    full = llm.generate(PROMPT, greedy(max_tokens=24, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    pieces = token_texts(llm, full.token_ids)
    min_tokens = 6
    head = "".join(pieces[:min_tokens])
    stop = head.strip()[:2]  # occurs within the first tokens
    assert len(stop) == 2 and head.find(stop) < len(head) - 1
    out = llm.generate(PROMPT, greedy(max_tokens=24, ignore_eos=True, min_tokens=min_tokens, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert out.text.startswith(head), f"cut below min_tokens: {out.text!r} vs the first tokens' {head!r}"
    assert len(out.token_ids) >= min_tokens
