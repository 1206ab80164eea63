"""torch.compile'd decode steps give exactly the eager engine's greedy tokens (with the one-region C++ step
off: minillm/cpu/decode_step.py takes a CPU float32 decode step wherever it applies, and its own tests
compare it with the op-by-op step, tests/test_cpu_decode_step.py)."""
import pytest

from tests.helpers.engine_utils import greedy, random_prompts, run_to_completion, tiny_model
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.sampling_params import SamplingParams

# log-prob gap (nats) under which two tokens count as tied when int8 K/V rounding tells them apart
NEAR_TIE_INT8 = 0.02


@pytest.mark.slow
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])  # int8: the scale tensors are compiled inputs too
def test_compiled_decode_matches_eager(kv_cache_dtype, capfd):
    model = tiny_model(heads=9, kv_heads=3, head_dim=16)
    prompts = random_prompts(5, 97, 2, 30, seed=7)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)

    def go(compile):
        eng = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=128, kv_cache_dtype=kv_cache_dtype,
                                                      max_num_seqs=64, max_num_batched_tokens=32, compile=compile,
                                                      cpu_decode_step=False))  # the graphs, not the C++ step
        for i, p in enumerate(prompts):
            eng.add_request(str(i), p, params)
        done = {}
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    done[out.request_id] = out.outputs[0]
        return [done[str(i)] for i in range(len(prompts))]

    import torch._inductor.config as inductor_config

    with inductor_config.patch(force_disable_caches=True):  # a cache hit would skip autotuning, and its output
        compiled = go(True)
    eager = go(False)
    if kv_cache_dtype == "auto":
        assert [c.token_ids for c in compiled] == [e.token_ids for e in eager]
    else:
        # int8 K/V: the compiled step rounds slightly different K/V values to int8 codes (another sum order,
        # and max-autotune picks each GEMM's kernel afresh here), so a near-tie may flip (1 run in 5 did).
        # Where a text parts, both tokens must be the eager step's own top two, a hair apart.
        for c, e in zip(compiled, eager):
            if c.token_ids == e.token_ids:
                continue
            i = next(j for j, (a, b) in enumerate(zip(c.token_ids, e.token_ids)) if a != b)
            lp = e.logprobs[i]
            assert c.token_ids[i] in lp, (i, c.token_ids[i], lp)
            assert lp[e.token_ids[i]] - lp[c.token_ids[i]] < NEAR_TIE_INT8, (i, lp)
        assert sum(c.token_ids == e.token_ids for c, e in zip(compiled, eager)) >= len(prompts) - 1
    # max_autotune benchmarks each GEMM's candidates; issue 16: without printing a table per GEMM
    err = capfd.readouterr().err
    assert "AUTOTUNE" not in err and "Autotune Choices" not in err


@pytest.mark.parametrize("layout", ["k-major", "row-major"])
def test_compiled_engine_keeps_the_lm_head_row_major_for_the_few_row_kernel(layout, monkeypatch):
    # the compiled step reads the body's weights in the chosen layout (minillm/cpu/__init__.compiled_body_layout);
    # the embedding and the LM head (which runs outside the compiled step) keep nn.Linear's layout, tied as
    # before, and every linear is a SkinnyLinear
    import torch

    from minillm.cpu.skinny_linear import SkinnyLinear

    monkeypatch.setenv("MINILLM_COMPILED_BODY", layout)
    model = tiny_model(heads=4, kv_heads=2, head_dim=16)  # tied embeddings
    eager_head = model.lm_head.weight
    LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=16, compile=True))
    assert isinstance(model.lm_head, SkinnyLinear) and model.lm_head.weight.is_contiguous()
    assert model.lm_head.weight is model.embed_tokens.weight is eager_head
    body = [m for m in model.layers.modules() if isinstance(m, torch.nn.Linear)]
    assert body and all(isinstance(m, SkinnyLinear) for m in body)
    if layout == "k-major":
        assert all(m.weight.t().is_contiguous() and not m.weight.is_contiguous() for m in body)
    else:
        assert all(m.weight.is_contiguous() for m in body)


def test_the_compiled_body_layout_follows_the_tiled_kernel_unless_the_variable_says_otherwise(monkeypatch):
    # row-major where the tiled kernel out-runs MKL at prefill's row counts (its prefill then runs the
    # kernel), K-major where MKL keeps those rows or the kernel did not load; the variable overrides both
    import minillm.cpu as cpu_fast_path
    from minillm.cpu.kernels import tiled_cpu

    monkeypatch.delenv("MINILLM_COMPILED_BODY", raising=False)
    monkeypatch.delenv("MINILLM_TILED", raising=False)
    measured = tiled_cpu.outruns_mkl.__wrapped__  # the timing itself, not this process's cached answer
    monkeypatch.setattr(tiled_cpu, "outruns_mkl", lambda: True)
    assert cpu_fast_path.compiled_body_layout() == "row-major"
    monkeypatch.setattr(tiled_cpu, "outruns_mkl", lambda: False)
    assert cpu_fast_path.compiled_body_layout() == "k-major"
    # the kernel missing: the real timing says no without measuring
    monkeypatch.setattr(tiled_cpu, "available", lambda: False)
    monkeypatch.setattr(tiled_cpu, "outruns_mkl", measured)
    assert cpu_fast_path.compiled_body_layout() == "k-major"
    monkeypatch.setenv("MINILLM_COMPILED_BODY", "k-major")
    monkeypatch.setattr(tiled_cpu, "outruns_mkl", lambda: True)
    assert cpu_fast_path.compiled_body_layout() == "k-major"
    monkeypatch.setenv("MINILLM_COMPILED_BODY", "row-major")
    monkeypatch.setattr(tiled_cpu, "outruns_mkl", lambda: False)
    assert cpu_fast_path.compiled_body_layout() == "row-major"
    monkeypatch.setenv("MINILLM_COMPILED_BODY", "column")
    with pytest.raises(ValueError, match="MINILLM_COMPILED_BODY must be one of"):
        cpu_fast_path.compiled_body_layout()


def rows_given_to_the_few_row_kernel(monkeypatch, seed: int, max_tokens: list[int]) -> list[int]:
    """Three prompts run eagerly and compiled on a tiny model: asserts the same greedy tokens, and returns
    the row counts of the few-row kernel's calls that Dynamo put into graphs (counted while it traces; not
    eager prefill or the LM head)."""
    import torch

    from minillm.cpu.kernels import skinny_cpu

    if not skinny_cpu.available():
        pytest.skip("the few-row kernel could not be built here")
    traced = []
    real = skinny_cpu.linear

    def counting(*args, **kwargs):
        if torch.compiler.is_compiling():
            traced.append(args[0].shape[0])
        return real(*args, **kwargs)

    prompts = random_prompts(3, 97, 4, 20, seed=seed)

    def go(compile):
        model = tiny_model(heads=4, kv_heads=2, head_dim=16, seed=seed)
        eng = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=8,
                                                      max_num_batched_tokens=64, compile=compile,
                                                      cpu_decode_step=False))  # the graphs, not the C++ step
        for i, (p, n) in enumerate(zip(prompts, max_tokens)):
            eng.add_request(str(i), p, greedy(n))
        out = run_to_completion(eng)
        return [out[str(i)] for i in range(len(prompts))]

    eager = go(False)
    monkeypatch.setattr(skinny_cpu, "linear", counting)
    assert go(True) == eager
    return traced


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["k-major", "row-major"])
def test_a_row_major_compiled_step_calls_the_few_row_kernel_and_matches_eager(layout, monkeypatch):
    """Row-major layers: a decode graph of a constant few rows calls the kernel's op, K-major ones never;
    both give the eager engine's greedy tokens."""
    monkeypatch.setenv("MINILLM_COMPILED_BODY", layout)
    traced = rows_given_to_the_few_row_kernel(monkeypatch, seed=11, max_tokens=[8, 8, 8])
    if layout == "row-major":
        assert traced and set(traced) <= {1, 2, 3}  # the graphs' decode rows: the few-row kernel's case
    else:
        assert not traced


@pytest.mark.slow
def test_a_compiled_graph_of_more_rows_than_its_limit_leaves_the_product_to_inductor(monkeypatch):
    """Row-major layers: graphs of up to GRAPH_MAX_ROWS decode rows call the few-row kernel, larger ones
    F.linear (inductor's GEMM ran faster there); the tokens stay the eager engine's."""
    from minillm.cpu import skinny_linear

    monkeypatch.setenv("MINILLM_COMPILED_BODY", "row-major")
    monkeypatch.setattr(skinny_linear, "GRAPH_MAX_ROWS", 2)
    # decode batches of 3, 2 and 1 rows as the requests finish
    traced = rows_given_to_the_few_row_kernel(monkeypatch, seed=12, max_tokens=[4, 8, 12])
    assert set(traced) == {1, 2}  # the 3-row graph multiplied without the kernel


@pytest.mark.slow
@pytest.mark.parametrize("direct", [True, False])
def test_a_compiled_graph_calls_the_cpu_kernels_as_c_functions_unless_told_not_to(direct, monkeypatch):
    """Row-major layers on the CPU: the C++ wrapper of each decode graph calls the few-row linear and the
    paged attention by their C names (engine/compile.py, direct_calls), not through the dispatcher, and
    the tokens are the eager engine's; MINILLM_COMPILE_DIRECT_CALLS=0 keeps the dispatcher."""
    import pickle

    from minillm.cpu import compiled_calls
    from minillm.cpu.kernels import paged_attention_cpu, skinny_cpu
    from minillm.engine import compile as engine_compile

    if not (skinny_cpu.available() and paged_attention_cpu.available()):
        pytest.skip("the CPU kernels could not be built here")
    monkeypatch.setenv("MINILLM_COMPILED_BODY", "row-major")
    monkeypatch.setenv("MINILLM_COMPILE_DIRECT_CALLS", "1" if direct else "0")
    calls = compiled_calls.direct_calls()
    assert len(calls) == (2 if direct else 0)
    if direct:  # the config inductor hashes into each graph's cache key must pickle (else: no disk cache)
        import torch
        assert torch.ops.minillm_skinny.linear.default in calls and torch.ops.minillm_attn.paged_decode.default in calls
        pickle.dumps(calls)
    import gc

    sources = []  # the generated code of each graph, read when its engine is collected and releases it
    release = engine_compile.release_graphs
    monkeypatch.setattr(engine_compile, "release_graphs", lambda code, modules: (
        sources.extend(open(m.__file__).read() for m in modules), release(code, modules)))
    rows_given_to_the_few_row_kernel(monkeypatch, seed=13, max_tokens=[6, 6, 6])  # asserts eager's tokens
    gc.collect()
    sources = "".join(sources)
    assert "inductor_entry_impl" in sources  # the graphs' C++ wrappers were read
    for namespace, op in (("minillm_skinny", "linear"), ("minillm_attn", "paged_decode")):
        assert (f"aoti_torch_cpu_{op}(" in sources) == direct
        assert (f'aoti_torch_call_dispatcher("{namespace}::{op}"' in sources) == (not direct)
