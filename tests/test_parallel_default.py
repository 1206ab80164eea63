"""tp=3 on the default model (SmolLM2-135M: 9 query / 3 KV heads, so one KV head per rank) vs one rank."""
from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from tests.test_parallel_tiny import recording_logits

pytestmark = pytest.mark.slow  # two workers each load and dequantize the GGUF (~35 s of CPU)

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three facts about the ocean:"]
LOGITS_ATOL = 1e-3  # float32 through 30 layers; measured max difference ~1e-5


def test_tp3_default_model_matches_one_rank(default_model):
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine = LLMEngine(default_model.model, default_model.tokenizer, default_model.eos_token_ids,
                       EngineConfig(block_size=16, num_kv_blocks=64))
    with recording_logits(engine.executor) as ref_logits:
        for i, p in enumerate(PROMPTS):
            engine.add_request(str(i), p, sp)
        done = {}
        while len(done) < len(PROMPTS):
            done.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    ref = [done[str(i)] for i in range(len(PROMPTS))]
    with LLM(block_size=16, num_kv_blocks=64, tensor_parallel_size=3) as llm:
        shard = llm.engine.model.tp_shard
        assert (shard.q_heads, shard.kv_heads) == ((0, 3), (0, 1))  # rank 0: query heads 0-2 share KV head 0
        with recording_logits(llm.engine.executor) as tp_logits:
            outs = llm.generate(PROMPTS, sp, use_tqdm=False)
        trace = llm.trace
    assert [o.outputs[0].token_ids for o in outs] == ref
    a, b = torch.cat(tp_logits), torch.cat(ref_logits)
    assert a.shape == b.shape and a.shape[1] == 49152
    err = (a - b).abs().max().item()
    assert err < LOGITS_ATOL, f"max |logit difference| {err:.2e}"
    hidden, layers = 576, 30
    assert all(t.allreduce_bytes == (2 * layers + 1) * t.num_tokens * hidden * 4 for t in trace)
