"""The engine with the Triton backend (interpreted on CPU) gives the torch backend's greedy tokens."""
import pytest

from tests.helpers.engine_utils import greedy, make_engine, random_prompts, run_to_completion, tiny_model


def run(model, prompts, backend, max_tokens, **kw):
    eng = make_engine(model, backend=backend, **kw)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, greedy(max_tokens))
    out = run_to_completion(eng)
    return [out[str(i)] for i in range(len(prompts))], eng


@pytest.mark.slow
def test_tiny_model_triton_equals_torch():
    # 9 query heads : 3 KV heads like the default model; a small pool forces preemption,
    # a small budget forces chunked prefill after cached prefixes
    model = tiny_model(heads=9, kv_heads=3, head_dim=16)
    prompts = random_prompts(6, 97, 3, 40, seed=3)
    prompts += [prompts[0] + p for p in prompts[1:3]]  # shared prefixes -> prefix-cache hits
    kw = dict(num_blocks=24, block_size=4, max_num_batched_tokens=24, max_num_seqs=4)
    ref, _ = run(model, prompts, "torch", 8, **kw)
    got, eng = run(model, prompts, "triton", 8, **kw)
    assert got == ref
    assert any(t.preemptions for t in eng.trace) or any(t.prefix_hit_tokens for t in eng.trace)


@pytest.mark.slow
@pytest.mark.default_model
def test_default_model_triton_equals_torch(default_model):
    from minillm.engine.config import EngineConfig
    from minillm.engine.llm_engine import LLMEngine

    tok = default_model.tokenizer
    prompts = [tok.encode(t, add_special_tokens=False) for t in ["The capital of France is", "1, 2, 3, 4,", "Hello, my name"]]

    def go(backend):
        eng = LLMEngine(default_model.model, tok, default_model.eos_token_ids,
                        EngineConfig(num_kv_blocks=16, max_num_seqs=64, max_num_batched_tokens=256,
                                     attention_backend=backend))
        for i, p in enumerate(prompts):
            eng.add_request(str(i), p, greedy(6))
        out = run_to_completion(eng)
        return [out[str(i)] for i in range(len(prompts))]

    assert go("triton") == go("torch")
