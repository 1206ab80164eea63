"""Builders shared by the server tests: a tiny engine that writes readable text, a slow engine, a live server.

The tiny random model shares the tiny BPE tokenizer's 320-token vocabulary. Its
tied embedding rows are zeroed for every token that does not decode to
printable ASCII, so the logits of those tokens are 0 and greedy (almost always)
picks a printable one: streamed text is real text, not U+FFFD bytes, and the
EOS token only ends a request when a test asks for it with stop_token_ids.
"""
from __future__ import annotations

import time

import torch

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.sampling_params import SamplingParams
from tests.helpers.engine_utils import tiny_model
from tests.helpers.tiny_tokenizer import EOS, make_tiny_tokenizer

MODEL_NAME = "tiny"


def printable_tiny_model(seed: int = 0):
    tok = make_tiny_tokenizer()
    model = tiny_model(seed, vocab=320)
    keep = torch.zeros(320, dtype=torch.bool)
    for i in range(320):
        s = tok.decode([i])
        keep[i] = i not in tok.all_special_ids and bool(s) and s.isascii() and s.isprintable()
    with torch.no_grad():
        model.embed_tokens.weight[~keep] = 0.0
    return model


class SlowEngine(LLMEngine):
    """Each step takes at least `delay` seconds: requests stay in flight long enough to test limits."""

    delay = 0.02

    def step(self):
        time.sleep(self.delay)
        return super().step()


def tiny_engine(num_blocks: int = 512, block_size: int = 4, max_num_seqs: int = 32, max_num_batched_tokens: int = 256,
                engine_cls: type[LLMEngine] = LLMEngine, seed: int = 0) -> LLMEngine:
    return engine_cls(
        printable_tiny_model(seed), make_tiny_tokenizer(), [EOS],
        EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_num_batched_tokens),
    )


def offline(prompt: str, params: SamplingParams, seed: int = 0, chat: bool = False) -> list:
    """The engine's own outputs for one prompt (no server): the reference for server answers. A text
    prompt gets the tokenizer's special tokens (its BOS), a rendered chat prompt none (its template's)."""
    engine = tiny_engine(seed=seed)
    ids = engine.tokenizer.encode(prompt, add_special_tokens=not chat)
    engine.add_request("ref", ids, params)
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out
    return final.outputs


def test_tiny_engine_writes_printable_text():
    outs = offline("The cat sat", SamplingParams(temperature=0.0, max_tokens=24))
    text = outs[0].text
    assert len(outs[0].token_ids) == 24 and text.isascii() and text.isprintable() and text.strip()


def test_slow_engine_is_slow():
    engine = tiny_engine(engine_cls=SlowEngine)
    t0 = time.perf_counter()
    engine.step()
    assert time.perf_counter() - t0 >= SlowEngine.delay
