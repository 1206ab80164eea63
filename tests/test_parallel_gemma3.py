"""Tensor parallelism on a tiny random Gemma 3: tp=2 gives tp=1's greedy tokens and logprobs.

Gemma differs from Llama where sharding touches it: the embedding is scaled by sqrt(hidden)
(the vocab-parallel embedding must keep the factor), local layers slide over a window, and
the final logits may be soft-capped after the vocab-parallel head.
"""
from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams
from tests.test_gemma3 import save_tiny_gemma3

pytestmark = pytest.mark.slow  # one worker process
ENGINE = dict(block_size=4, num_kv_blocks=96, max_num_batched_tokens=16, seed=0)
PROMPTS = [[5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49], [7, 8, 9]]  # the first is past the window of 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp-gemma3") / "tiny-gemma3"
    save_tiny_gemma3(path)
    return str(path)


def run(folder: str, tp: int):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    with LLM(folder, tensor_parallel_size=tp, **ENGINE) as llm:
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], [o.outputs[0].logprobs for o in outs]


def test_tp2_equals_tp1(folder):
    ids1, lp1 = run(folder, 1)
    ids2, lp2 = run(folder, 2)
    assert ids2 == ids1
    for ids, a, b in zip(ids1, lp1, lp2):
        for tok, step_a, step_b in zip(ids, a, b):  # the chosen token's log-probability, step by step
            assert abs(step_a[tok] - step_b[tok]) < 1e-4, (tok, step_a[tok], step_b[tok])
