"""The engine on the real default model (SmolLM2-135M-Instruct GGUF) against transformers and itself."""
from __future__ import annotations

import pytest
import torch

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.sampling_params import SamplingParams

pytestmark = [pytest.mark.default_model, pytest.mark.slow]

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the ocean.", "Explain gravity to a child.",
    "List three uses of a paperclip.", "What is 17 plus 25?", "Name a planet in our solar system.",
    "Give me a tip for sleeping better.", "Translate 'thank you' into German.", "Who wrote Hamlet?",
    "Describe a sunset in one sentence.", "What is photosynthesis?", "Suggest a name for a robot.",
    "Why do cats purr?", "What is the largest ocean?", "Write a limerick about a frog.", "How do rainbows form?",
]


def make_engine(loaded, num_blocks=None, budget=2048, max_seqs=64, prefix=True, chunked=True, block_size=16):
    return LLMEngine(
        loaded.model, loaded.tokenizer, loaded.eos_token_ids,
        EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, kv_cache_memory_bytes=128 << 20,
                     enable_prefix_caching=prefix, max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                     enable_chunked_prefill=chunked),
    )


def run(engine, prompts, max_tokens, ignore_eos=True):
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos))
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o.outputs[0].token_ids
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "blocks leaked"
    return [done[str(i)] for i in range(len(prompts))]


def chat_ids(tok, q):
    text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


@torch.inference_mode()
def hf_greedy(hf_model, ids, n):
    """Greedy decoding with transformers' own forward and KV cache, exactly n tokens.

    (generate() would stop at the model's end-of-sequence token whatever we pass.)
    """
    import inspect

    cache_kw = "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"
    out = hf_model(torch.tensor([ids]), use_cache=True)
    toks = []
    while True:
        toks.append(int(out.logits[0, -1].argmax()))
        if len(toks) == n:
            return toks
        past = getattr(out, "cache", None) or out.past_key_values
        out = hf_model(torch.tensor([[toks[-1]]]), use_cache=True, **{cache_kw: past})


def test_greedy_64_tokens_match_transformers(default_model, hf_default_reference):
    prompts = [chat_ids(default_model.tokenizer, q) for q in QUESTIONS]
    ours = run(make_engine(default_model), prompts, 64)
    mismatches = []
    for q, p, o in zip(QUESTIONS, prompts, ours):
        ref = hf_greedy(hf_default_reference, p, 64)
        assert len(ref) == 64, "transformers stopped early"
        if o != ref:
            first = next(i for i, (a, b) in enumerate(zip(o, ref)) if a != b)
            mismatches.append(f"{q!r}: first difference at token {first}")
    assert not mismatches, mismatches


def test_32_mixed_requests_with_preemption_equal_alone(default_model):
    tok = default_model.tokenizer
    base = [chat_ids(tok, q) for q in QUESTIONS]
    # mixed lengths: the chat prompts, and the same with a longer preamble
    prompts = base + [chat_ids(tok, "Please answer carefully and in detail. " * (1 + i % 6) + q)
                      for i, q in enumerate(QUESTIONS)]
    max_tokens = 24
    alone = [run(make_engine(default_model, num_blocks=64, max_seqs=1, prefix=False), [p], max_tokens)[0]
             for p in prompts]
    eng = make_engine(default_model, num_blocks=40, budget=96, max_seqs=32)  # 640 token slots for ~32 x 60
    together = run(eng, prompts, max_tokens)
    assert sum(len(t.preemptions) for t in eng.trace) > 0, "the pool was meant to force preemption"
    assert any(t.num_prefill_tokens and t.num_decode_tokens for t in eng.trace), "chunked prefill never mixed"
    assert together == alone


def test_prefix_cache_and_chunking_do_not_change_outputs(default_model):
    tok = default_model.tokenizer
    system = "You are a meticulous assistant who answers questions about science and history. " * 4
    prompts = [tok.encode(tok.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": q}],
        tokenize=False, add_generation_prompt=True), add_special_tokens=False) for q in QUESTIONS[:6]]
    cached_eng = make_engine(default_model, max_seqs=1)  # one at a time, so later requests find the prefix
    cached = run(cached_eng, prompts, 16)
    uncached = run(make_engine(default_model, max_seqs=1, prefix=False), prompts, 16)
    whole = run(make_engine(default_model, prefix=False, chunked=False), prompts, 16)
    chunked = run(make_engine(default_model, prefix=False, budget=40), prompts, 16)
    assert cached == uncached == whole == chunked
    hits = sum(t.prefix_hit_tokens for t in cached_eng.trace)
    shared_blocks = (len(tok.encode(system)) // 16)
    assert hits >= 5 * shared_blocks * 16, f"only {hits} prefix tokens hit"
    assert any(s.num_prefix_hit_tokens > 0 for t in cached_eng.trace for s in t.scheduled)
