"""Chat on the real default model (SmolLM2-135M-Instruct): its tokenizer, chat template and EOS, through the server."""
from __future__ import annotations

import openai
import pytest

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.sampling_params import SamplingParams
from minillm.server import create_app
from minillm.server.background import ServerThread

pytestmark = [pytest.mark.slow, pytest.mark.default_model]

NAME = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served(default_model):
    dm = default_model
    engine = LLMEngine(dm.model, dm.tokenizer, dm.eos_token_ids,
                       EngineConfig(block_size=16, num_kv_blocks=64, max_num_seqs=8, max_num_batched_tokens=256))
    # the reference, from the same engine before the server owns it
    prompt = dm.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    engine.add_request("ref", dm.tokenizer.encode(prompt, add_special_tokens=False),
                       SamplingParams(temperature=0.0, max_tokens=12))
    ref = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            ref = out
    with ServerThread(create_app(engine, model_name=NAME)) as srv:
        yield srv, ref, engine


def test_chat_whole_and_streamed(served):
    srv, ref, engine = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=12, temperature=0)
    assert r.choices[0].message.content == ref.outputs[0].text and r.choices[0].message.content.strip()
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.outputs[0].token_ids)
    chunks = list(client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=12, temperature=0,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.outputs[0].text
    # a real tokenizer gives readable logprob tokens
    r = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3)
    assert "".join(t.token for t in r.choices[0].logprobs.content) == r.choices[0].message.content
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
