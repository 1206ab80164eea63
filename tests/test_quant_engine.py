"""The engine on the default model with quantized weights: greedy output against the float model's."""
from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "List three colors of the rainbow:",
    "The quick brown fox",
    "To sort a list in Python, use",
]


def _greedy(llm: LLM) -> tuple[list[list[int]], list[list[int]]]:
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    return [o.prompt_token_ids for o in outs], [o.outputs[0].token_ids for o in outs]


def _teacher_forced_agreement(llm: LLM, prompts: list[list[int]], continuations: list[list[int]]) -> float:
    """Feed the float model's greedy text to `llm`'s model through the paged path: how often is its top-1 the same?"""
    from minillm.eval import score_windows

    hits = total = 0
    for p, c in zip(prompts, continuations):
        top1 = score_windows(llm.loaded.model, torch.tensor([p + c])).top1[0, len(p) - 1 :]
        hits += int((top1 == torch.tensor(c)).sum())
        total += len(c)
    return hits / total


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


NEAR_TIE = 0.5  # logits; the same bound test_spec_real_pair.py states for int8 activations


@pytest.fixture(scope="module")
def float_llm():
    return LLM(max_num_seqs=8)


@pytest.fixture(scope="module")
def float_tokens(float_llm):
    return _greedy(float_llm)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["int8", "gguf"])
def test_quantized_greedy_output_stays_close_to_float(method, float_llm, float_tokens):
    llm = LLM(quantization=method, max_num_seqs=8)
    prompts, ref = float_tokens
    _, got = _greedy(llm)
    prefixes = [_common_prefix(a, b) for a, b in zip(ref, got)]
    agree = _teacher_forced_agreement(llm, prompts, ref)
    print(method, "common greedy prefix per prompt (of 24):", prefixes, "teacher-forced top-1 agreement:", agree)
    # Measured (SmolLM2-135M, 6 prompts x 24 tokens): teacher-forced top-1 agreement with the
    # float model's greedy text >= 0.97 for int8 and for gguf (the file's Q4_1 codes with bf16
    # scales). Free-running greedy texts agree until a near-tie flips, then part ways for good
    # (int8: common prefixes of e.g. [19, 24, 24, 5, 2, 24]), so only the first tokens are compared.
    assert agree >= 0.95, agree
    # a text may part from the float text only where the float model itself nearly ties: both
    # quantizations move logits by a few tenths (gguf rounds every activation to int8, a step function,
    # so even 1e-7 of float reordering in a kernel -- the CPU paged attention, the 8-row GGUF layouts --
    # moves the last layer's logits by ~0.3 over 30 layers). Measured partings for gguf: float top-2 gaps
    # 0.22, 0.12, 0.10, 0.05, 0.006 (prefixes [5, 24, 9, 0, 17, 14]); a sum-of-prefixes bound failed on that.
    from minillm.models.standalone import forward_logits

    for p, r, n in zip(prompts, ref, prefixes):
        if n < len(r):
            top2 = forward_logits(float_llm.engine.model, p + r[:n])[-1].topk(2).values
            assert float(top2[0] - top2[1]) < NEAR_TIE, (n, float(top2[0] - top2[1]))
