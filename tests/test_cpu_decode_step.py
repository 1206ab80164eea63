"""The one-region CPU decode step (minillm/cpu/kernels/decode_step.cpp, minillm/cpu/decode_step.py).

It must be the op-by-op decode step exactly: the same hidden states bit for bit and the same K/V in the
pool, for every batch size it takes, with GQA, a q/k/v bias, sliding-window layers, keys split between
threads (an odd number of kv heads) and one thread or two; it must hand the steps it does not take
(more than 16 rows, prefill chunks) to the op-by-op path, say why it does not apply where it does not,
and refuse bad input with a clear error before touching the pool.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from minillm.config import ModelConfig  # noqa: E402
from minillm.engine.config import EngineConfig  # noqa: E402
from minillm.engine.llm_engine import LLMEngine  # noqa: E402
from minillm.cpu.kernels import decode_step_cpu  # noqa: E402
from minillm.models.llama import LlamaForCausalLM  # noqa: E402
from tests.helpers.engine_utils import greedy, random_prompts, tiny_model  # noqa: E402

pytestmark = pytest.mark.skipif(not decode_step_cpu.available(), reason="the decode step kernel did not build")


def model_with(seed=0, heads=6, kv_heads=3, head_dim=16, bias=False, windows=None, layers=2, vocab=83):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=heads * head_dim, intermediate_size=80, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=[], attention_bias=bias,
                      sliding_window=windows and 24, layer_types=windows)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.08) if p.dim() == 2 else p.add_(torch.randn_like(p) * 0.1)
    return model


def run(model, prompts, new_tokens, one_region, block_size=4):
    """Serve the prompts greedily; every decode step's hidden states, which path ran it, and the final pool."""
    cfg = EngineConfig(block_size=block_size, num_kv_blocks=512, max_num_seqs=32, max_num_batched_tokens=512,
                       cpu_decode_step=None if one_region else False)
    engine = LLMEngine(model, None, [], cfg)
    runner = engine.executor
    assert (runner.step_runner is not None) == one_region, runner.fast_path.decode_step_skipped
    steps = []
    execute = runner.execute

    def recorded(batch):
        logits = execute(batch)
        if batch.is_decode_only:
            took = runner.step_runner is not None and runner.step_runner.fits(batch)
            steps.append((took, runner.last_hidden.clone()))
        return logits

    runner.execute = recorded
    for i, p in enumerate(prompts):  # new_tokens: one count for all, or one per prompt
        engine.add_request(str(i), p, greedy(new_tokens if isinstance(new_tokens, int) else new_tokens[i]))
    tokens = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = out.outputs[0].token_ids
    pool = [t.clone() for t in runner.pool.k_caches + runner.pool.v_caches]
    return tokens, steps, pool


def assert_same_steps(model, prompts, new_tokens, threads=None, block_size=4):
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        ops = run(model, prompts, new_tokens, False, block_size)
        one = run(model, prompts, new_tokens, True, block_size)
    finally:
        torch.set_num_threads(before)
    assert ops[0] == one[0]
    assert len(ops[1]) == len(one[1])
    assert any(took for took, _ in one[1]), "the one-region step never ran"
    for (_, a), (took, b) in zip(ops[1], one[1]):
        assert torch.equal(a, b), f"a decode step's hidden states differ (one-region step: {took})"
    for a, b in zip(ops[2], one[2]):
        assert torch.equal(a, b), "the pools differ"
    return one[1]


@pytest.mark.parametrize("batch", [1, 2, 5, 16])
def test_the_step_equals_the_op_by_op_step_bit_for_bit(batch):
    prompts = random_prompts(batch, 83, 3, 30, seed=batch)
    steps = assert_same_steps(model_with(seed=batch), prompts, 12)
    assert all(took for took, _ in steps)


def test_more_rows_than_the_step_takes_run_op_by_op():
    steps = assert_same_steps(model_with(seed=3), random_prompts(19, 83, 3, 12, seed=19), [3] * 4 + [9] * 15)
    took = [t for t, h in steps]
    assert not took[0] and any(took), "19 rows run op by op, and the step takes over as requests finish"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_long_sequences_whose_keys_split_between_threads(threads):
    """Three kv heads on two threads: keys past 2 x 64 split into parts whose softmaxes merge; one and
    three threads split otherwise. A block size of 16 as the engine's default, and of 4."""
    prompts = random_prompts(1, 83, 150, 151, seed=7) + random_prompts(1, 83, 200, 201, seed=8)
    assert_same_steps(model_with(seed=5), prompts[:1], 40, threads=threads, block_size=16)
    assert_same_steps(model_with(seed=6), prompts, 20, threads=threads)


def test_a_qkv_bias_and_sliding_window_layers():
    model = model_with(seed=9, bias=True, windows=["sliding_attention", "full_attention", "sliding_attention"],
                       layers=3)
    assert model.layers[0].self_attn.qkv_proj.bias is not None
    assert_same_steps(model, random_prompts(3, 83, 20, 40, seed=9), 16)


def test_a_model_the_step_does_not_cover_says_why(monkeypatch):
    bf16 = tiny_model(dtype=torch.bfloat16)
    cases = [
        (tiny_model(), dict(cpu_decode_step=False), "turned off"),
        (bf16, {}, "bfloat16 weights"),
        (tiny_model(), dict(kv_cache_dtype="int8"), "quantized KV cache"),
        (tiny_model(), dict(attention_backend="triton"), "triton attention backend"),
    ]
    for model, options, reason in cases:
        engine = LLMEngine(model, None, [], EngineConfig(num_kv_blocks=64, **options))
        assert engine.executor.step_runner is None
        assert reason in engine.executor.fast_path.decode_step_skipped
    # with compile=True too: the graph then serves the steps the C++ step does not take (where the compiled
    # body stays row-major: K-major weights, the choice on CPUs where MKL out-runs the tiled kernel, rule it out)
    monkeypatch.setenv("MINILLM_COMPILED_BODY", "row-major")
    assert LLMEngine(tiny_model(), None, [], EngineConfig(num_kv_blocks=64, compile=True)).executor.step_runner.max_rows == 16
    with pytest.raises(ValueError, match="cpu_decode_step=True.*quantized KV cache"):
        LLMEngine(tiny_model(), None, [], EngineConfig(num_kv_blocks=64, kv_cache_dtype="int8", cpu_decode_step=True))
    with pytest.raises(ValueError, match="cpu_decode_step must be True, False or None"):
        EngineConfig(cpu_decode_step="yes").validate()


def test_bad_input_is_refused_before_the_pool_is_touched():
    engine = LLMEngine(tiny_model(vocab=61), None, [], EngineConfig(block_size=4, num_kv_blocks=8))
    runner = engine.executor
    step = runner.step_runner.step
    pool = [t.clone() for t in runner.pool.k_caches]
    bad = [
        (([61], [0], [0], [0, 1]), "not in the vocabulary"),
        (([1], [4], [0], [0, 1]), "does not reach position 4"),
        (([1], [0], [8], [0, 1]), "block 8 is not in the pool"),
        (([1], [600], [0] * 150, [0, 150]), "past the RoPE table"),
        (([1] * 17, [0] * 17, list(range(17)), list(range(18))), "1 to 16 decode rows"),
        (([1, 2], [0], [0], [0, 1]), "a position and a block table per row"),
    ]
    for args, message in bad:
        with pytest.raises(RuntimeError, match=message):
            step.run(*args, False)
    assert all(torch.equal(a, b) for a, b in zip(pool, runner.pool.k_caches))
    hidden = step.run([1, 2], [0, 3], [0, 1], [0, 1, 2], False)
    assert hidden.shape == (2, 64) and torch.isfinite(hidden).all()


def run_spec(model, prompts, one_region, panels, speculative, prefix_caching=False):
    """Serve with speculative decoding (or prefix caching): every step's hidden states of every row that ran
    through the one-region step's kind of rows, which path took it, and the final pool."""
    import minillm.cpu.panels as few_row_panels

    os.environ[few_row_panels.PANELS_ENV] = "1" if panels else "0"
    try:
        cfg = EngineConfig(block_size=4, num_kv_blocks=512, max_num_seqs=8, max_num_batched_tokens=512,
                           speculative=speculative, enable_prefix_caching=prefix_caching,
                           cpu_decode_step=None if one_region else False)
        engine = LLMEngine(model, None, [], cfg)
    finally:
        del os.environ[few_row_panels.PANELS_ENV]
    runner = engine.executor
    assert (not runner.fast_path.panels.skipped) == panels, runner.fast_path.panels
    runner.keep_all_hidden = True
    steps, execute = [], runner.execute

    def recorded(batch):
        logits = execute(batch)
        took = runner.step_runner is not None and runner.step_runner.fits(batch)
        steps.append((took, max(batch.query_lens), runner.last_all_hidden.clone()))
        return logits

    runner.execute = recorded
    tokens = {}
    for i, p in enumerate(prompts):  # one after another: a later prompt may hit an earlier one's blocks
        engine.add_request(str(i), p, greedy(14))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    tokens[out.request_id] = out.outputs[0].token_ids
    return tokens, steps, [t.clone() for t in runner.pool.k_caches + runner.pool.v_caches]


@pytest.mark.parametrize("panels", [False, True])
def test_verify_steps_equal_the_op_by_op_step_bit_for_bit(panels):
    """A speculative engine's verify steps (k + 1 rows of one sequence, each seeing the keys up to its own
    position) run in the step too, reading the panel-packed weights at 4-8 rows where the engine packed
    them, as SkinnyLinear does."""
    from minillm.cpu.kernels import panel_cpu

    if panels and not panel_cpu.available():
        pytest.skip("the panel kernel's AVX-512 path is not built here")
    model = model_with(seed=11)
    prompts = random_prompts(2, 83, 10, 30, seed=11)
    # a copy of the target as the draft: every guess accepted, so every verify step has k + 1 rows (4 and 6:
    # panel rows); an unrelated draft: guesses rejected and their K/V slots given back
    for k, draft in ((3, model_with(seed=11)), (5, model_with(seed=11)), (3, model_with(seed=13))):
        spec = {"method": "draft", "model": draft, "num_tokens": k}
        ops = run_spec(model, prompts, False, panels, spec)
        one = run_spec(model, prompts, True, panels, spec)
        assert ops[0] == one[0]
        assert any(took and rows == k + 1 for took, rows, _ in one[1]), "no verify step ran in the step"
        for (_, _, a), (took, rows, b) in zip(ops[1], one[1]):
            assert torch.equal(a, b), f"a step of {rows}-row chunks differs (one-region step: {took})"
        assert all(torch.equal(a, b) for a, b in zip(ops[2], one[2])), "the pools differ"


def test_a_prompts_tail_after_a_prefix_hit_runs_in_the_step():
    """A prompt whose first blocks the prefix cache holds computes only its tail: a short chunk over cached
    keys, the rows the step takes; a prompt's first chunk (no cached keys) stays with the chunk path."""
    model = model_with(seed=12)
    shared = list(range(3, 23))
    prompts = [shared + [40, 41], shared + [50, 51, 52, 53, 54]]
    ops = run_spec(model, prompts, False, False, None, prefix_caching=True)
    one = run_spec(model, prompts, True, False, None, prefix_caching=True)
    assert ops[0] == one[0]
    took = [(t, rows) for t, rows, _ in one[1]]
    assert (False, 22) in took and any(t and rows > 1 for t, rows in took), took
    for (_, _, a), (_, _, b) in zip(ops[1], one[1]):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(ops[2], one[2]))


def test_a_forward_hook_sends_the_step_back_to_the_layers():
    """The step runs C++, not the modules' Python: while a module carries a forward hook (registered after
    the engine started) the layers run op by op and the hook sees every step; removed, the step resumes."""
    model = model_with(seed=14)
    engine = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=64))
    step = engine.executor.step_runner
    seen = []
    handle = model.layers[1].mlp.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
    engine.add_request("a", [3, 4, 5], greedy(4))
    while engine.has_unfinished_requests():
        engine.step()
    assert seen == [3, 1, 1, 1] and step.hooked == "a forward hook on layers.1.mlp"
    handle.remove()
    engine.add_request("b", [3, 4, 5], greedy(4))
    while engine.has_unfinished_requests():
        engine.step()
    assert step.hooked is None and len(seen) == 4
