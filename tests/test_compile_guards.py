"""Guards evaluated once per shape class (minillm/engine/compile.py): the key tells apart what
Dynamo's guards tell apart, and a compiled engine that skips seen guards gives eager's tokens."""
import dataclasses

import pytest
import torch

from minillm.engine.compile import frozen_compile, shape_class
from tests.helpers.engine_utils import greedy, random_prompts, run_to_completion, tiny_model
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine


@dataclasses.dataclass
class Meta:
    lens: torch.Tensor
    n: int
    names: list[int]
    scale: float = 0.5


def test_sizes_fall_into_zero_one_and_many():
    key = lambda *shape: shape_class(torch.empty(shape))
    assert key(5, 64) == key(9, 64) == key(2, 64)  # symbolic sizes: one graph serves them all
    assert key(1, 64) != key(2, 64)  # Dynamo specialises a size of 1
    assert key(0, 64) != key(1, 64)
    assert shape_class(torch.empty(3, dtype=torch.int32)) != shape_class(torch.empty(3))
    assert shape_class(torch.empty(4, 4).t()) != shape_class(torch.empty(4, 4))  # strides differ


def test_dataclass_fields_lists_and_floats_are_keyed():
    m = Meta(torch.ones(3), 3, [2, 3, 4])
    assert shape_class(m) == shape_class(Meta(torch.ones(7), 7, [5, 9, 4]))
    assert shape_class(m) != shape_class(Meta(torch.ones(1), 1, [5]))
    assert shape_class(m) != shape_class(Meta(torch.ones(3), 3, [2, 3]))  # list length
    assert shape_class(m) != shape_class(Meta(torch.ones(3), 3, [2, 3, 4], scale=0.25))  # floats are specialised
    with pytest.raises(TypeError, match="no shape class"):
        shape_class(object())


def test_a_new_shape_class_runs_the_guards_and_recompiles():
    """The first call of each class goes through Dynamo's guards; a size-1 input after a
    size-3 one must not reuse the size-3 graph blindly (it would if every guard were skipped)."""
    def f(x):
        return x * 2 + x.shape[0]

    call = frozen_compile(f)
    for n in (3, 5, 1, 4, 1):
        x = torch.arange(n, dtype=torch.float32)
        assert torch.equal(call(x), x * 2 + n)
    assert len(call.shape_classes_seen) == 2


def test_an_audit_call_catches_a_distinction_the_classes_miss(monkeypatch):
    """A branch on an int's value is a guard the shape class cannot see (ints are keyed 0/1/2+).
    Dynamo refuses to compile under the skipping stance (with one graph cached it still checks it);
    the refusal comes before the graph runs, so the call reruns with full guards and skipping stops.
    (The periodic full-guard audit covers the case where the graphs' differentiating guards pass.)"""
    import minillm.engine.compile as compile_mod

    monkeypatch.setattr(compile_mod, "AUDIT_EVERY", 4)

    def f(x, n):
        return x + 1 if n > 5 else x - 1

    call = frozen_compile(f)
    x = torch.zeros(3)
    assert torch.equal(call(x, 9), x + 1)
    with pytest.warns(RuntimeWarning, match="guards now run on every step"):
        for _ in range(4):
            assert torch.equal(call(x, 3), x - 1)
    assert torch.equal(call(x, 3), x - 1) and torch.equal(call(x, 9), x + 1)
    assert not call.shape_classes_seen


@pytest.mark.slow
def test_two_compiled_models_of_one_class_step_in_turn():
    """Two engines over two models of the same class (a draft and its target), each compiled over its own
    copy of `forward`'s code (compile.private_code). Stepping them in turn, with batches shrinking from 4
    to 1 and block tables of one and of several blocks, each must still give its own eager tokens."""
    models = [tiny_model(seed=1), tiny_model(seed=2)]  # one structure: only the frozen weights differ
    prompts = random_prompts(4, 97, 1, 20, seed=5)

    def engine(model, compile):
        eng = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=4,
                                                      max_num_batched_tokens=64, compile=compile,
                                                      cpu_decode_step=False))  # the graphs are the subject
        for i, p in enumerate(prompts):
            eng.add_request(str(i), p, greedy(6 + 3 * i))
        return eng

    def tokens(eng, done):
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids

    expected = [run_to_completion(engine(m, False)) for m in models]
    engines, got = [engine(m, True) for m in models], [{}, {}]
    while any(e.has_unfinished_requests() for e in engines):
        for eng, done in zip(engines, got):
            if eng.has_unfinished_requests():
                tokens(eng, done)
    assert got == expected
    for eng in engines:
        assert 2 <= len(eng.executor.compiled_decode.shape_classes_seen) <= 6  # batch 1 and 2+ at least


class Scale(torch.nn.Module):
    """One class, many instances: what a notebook or a test worker makes of a model class."""

    def __init__(self, seed: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(seed)))

    def forward(self, x):
        return x @ self.weight


def test_every_compiled_instance_gets_graphs_of_its_own_past_dynamos_recompile_limit():
    """Dynamo keeps graphs on the code object and stops compiling a code object after 8 graphs for one
    set of guarded objects, running it eagerly instead; instances of one class used to share `forward`'s
    code (and the entries of dropped instances still counted). Each compiled function now has its own."""
    from minillm.engine.compile import graphs_compiled
    x = torch.randn(2, 8)
    for seed in range(10):  # kept alive, as the engines of one process may be
        module = Scale(seed)
        call = frozen_compile(module.forward)
        before = graphs_compiled()
        with torch.no_grad():  # as an engine runs: the weights become the graph's constants
            assert torch.allclose(call(x), x @ module.weight)
        assert graphs_compiled() == before + 1, f"instance {seed} ran without a graph of its own"


def test_a_dropped_compiled_function_frees_its_frozen_weights():
    """Freezing makes the weights a graph's constants; Dynamo's cache entries and inductor's module list
    held them after the engine was gone (compile.release_graphs)."""
    import gc
    import weakref
    module = Scale(0)
    call = frozen_compile(module.forward, cpu_wrapper=True)
    with torch.no_grad():
        call(torch.randn(2, 8))
    weight = weakref.ref(module.weight)
    del module, call
    gc.collect()
    assert weight() is None
