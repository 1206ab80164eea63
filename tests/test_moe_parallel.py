"""Expert parallelism (parallel/shard.py): a MoE model over 2 ranks gives the one-rank tokens, logits and routing.

With tensor_parallel_size=2 a MoE layer keeps half the experts on each rank (and half
the shared expert's columns), routes every token on every rank, and sums the ranks'
partial outputs with one all-reduce. The worker is forked (no CUDA here) and loads the
saved folder itself, as in tests/test_parallel_tiny.py. Logits are compared at the
sampler's input: only the order of the final sums differs (measured max 5.3e-6).
"""
from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams
from tests.helpers.tiny_moe import make_tiny_moe
from tests.test_parallel_tiny import recording_logits

LOGITS_ATOL = 1e-4
ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, seed=0)
PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58], [1, 7, 8, 9],
           [1, 200, 100, 250, 17, 300, 5]]


def run(folder: str, **options):
    with LLM(folder, **ENGINE, **options) as llm:
        with recording_logits(llm.engine.executor) as logits:
            out = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        return [o.outputs[0].token_ids for o in out], torch.cat(logits), llm.trace, llm.loaded.model


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral"])
def test_expert_parallel_equals_one_rank(family, tmp_path):
    folder, _ = make_tiny_moe(tmp_path, family)
    tokens, logits, trace, _ = run(str(folder))
    ep_tokens, ep_logits, ep_trace, shard = run(str(folder), tensor_parallel_size=2)
    assert ep_tokens == tokens
    err = (ep_logits - logits).abs().max().item()
    print(f"{family}: max |logit difference| {err:.2e}")
    assert err < LOGITS_ATOL
    # rank 0 really holds half the experts, and still counts every expert's tokens
    blocks = [layer.mlp for layer in shard.layers if hasattr(layer.mlp, "experts")]
    e = shard.config.num_experts
    assert blocks and all(b.expert_range == (0, e // 2) and b.experts.num_experts == e // 2 for b in blocks)
    assert [t.expert_tokens for t in ep_trace] == [t.expert_tokens for t in trace]
    # one all-reduce per MoE layer, as a dense MLP's down_proj: (2 per layer + the embedding's) x T x H fp32
    layers, hidden = shard.full_config.num_hidden_layers, shard.full_config.hidden_size
    assert all(t.allreduce_bytes == (2 * layers + 1) * t.num_tokens * hidden * 4 for t in ep_trace)
