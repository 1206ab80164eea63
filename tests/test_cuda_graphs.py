"""CUDA graphs for decode (engine/cuda_graphs.py): buckets, padding, static buffers, eager fallback.

No GPU here: the graphs' static buffers and padding run without capture (ModelRunner(graphs=True) on a
CPU), and every step must give the real rows exactly the logits an unpadded eager step gives, for
batch sizes inside and outside the buckets, in both attention backends and with an int8 cache. The
padding rows must leave every sequence's K/V untouched (they write to the scratch block only).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from minillm.engine.config import EngineConfig  # noqa: E402
from minillm.engine.cuda_graphs import bucket_for, graph_buckets  # noqa: E402
from minillm.engine.llm_engine import LLMEngine  # noqa: E402
from minillm.engine.model_runner import ModelRunner, use_cuda_graphs  # noqa: E402
from tests.helpers.engine_utils import greedy, random_prompts, run_to_completion, tiny_model  # noqa: E402


def test_buckets():
    assert graph_buckets(128) == [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128]
    assert graph_buckets(5) == [1, 2, 4]
    assert graph_buckets(20) == [1, 2, 4, 8, 16]
    b = graph_buckets(40)
    assert [bucket_for(n, b) for n in (1, 3, 5, 9, 16, 17, 32, 33, 40)] == [1, 4, 8, 16, 16, 32, 32, None, None]


def test_default_is_on_for_cuda_only():
    cfg = EngineConfig()
    assert use_cuda_graphs(cfg, torch.device("cuda")) is True
    assert use_cuda_graphs(cfg, torch.device("cpu")) is False
    assert use_cuda_graphs(EngineConfig(compile=True), torch.device("cuda")) is False
    with pytest.raises(ValueError, match="needs a CUDA device"):
        use_cuda_graphs(EngineConfig(cuda_graphs=True), torch.device("cpu"))
    with pytest.raises(ValueError, match="choose one"):
        EngineConfig(cuda_graphs=True, compile=True).validate()


def runners(backend="torch", kv="auto"):
    model = tiny_model(seed=4, vocab=61, max_pos=96)
    cfg = EngineConfig(block_size=4, num_kv_blocks=96, max_num_seqs=20, attention_backend=backend, kv_cache_dtype=kv)
    return model, ModelRunner(model, cfg, graphs=True), cfg


@pytest.mark.parametrize("backend,kv", [("torch", "auto"), ("torch", "int8"), ("triton", "auto")])
def test_padded_replays_give_the_eager_tokens(backend, kv):
    """Whole engine runs: batch sizes 3, 7, 18 (padded to 4 and 8; 18 is past the largest bucket, 16: eager)."""
    model, _, cfg = runners(backend, kv)
    for n in (3, 7, 18):
        prompts = random_prompts(n, 61, 3, 11, seed=n)

        def run(graphs):
            e = LLMEngine(model, None, [], cfg)
            e.executor = ModelRunner(model, cfg, graphs=graphs)  # the engine's pool, with or without graphs
            for i, p in enumerate(prompts):
                e.add_request(str(i), p, greedy(9))
            return run_to_completion(e), e.executor

        ref, _ = run(False)
        out, runner = run(True)
        assert out == ref
        expected = 0 if n > 16 else 1  # decode steps replayed (a batch of 18 decodes eagerly)
        assert (runner.decode_graphs.num_replays > 0) == bool(expected)


def test_padding_rows_write_only_the_scratch_block():
    model, runner, cfg = runners()
    from minillm.engine.batch import StepBatch

    tables = [[1, 2], [3], [5, 6, 7]]
    lens = [6, 3, 10]
    prompt_rows = [(t, L) for t, L in zip(tables, lens)]
    for t, L in prompt_rows:  # cache L - 1 tokens of each
        runner.execute(StepBatch(list(range(3, 3 + L - 1)), list(range(L - 1)), [L - 1], [L - 1], [t], [], [], [None]))
    before = [t.clone() for t in runner.pool.tensors()]
    step = StepBatch([9, 8, 7], [L - 1 for L in lens], [1, 1, 1], lens, tables, [0, 1, 2], [(0, 1), (1, 1), (2, 1)],
                     [None] * 3)
    logits = runner.execute(step)  # 3 rows padded to the bucket of 4
    scratch = runner.plan.num_blocks
    written = {tables[i][(L - 1) // 4] * 4 + (L - 1) % 4 for i, L in enumerate(lens)}
    for a, b in zip(before, runner.pool.tensors()):
        flat_a, flat_b = a.view(a.shape[0] * a.shape[1], -1), b.view(b.shape[0] * b.shape[1], -1)
        changed = {int(r) for r in (flat_a != flat_b).any(-1).nonzero().flatten()}
        assert changed - written <= set(range(scratch * 4, scratch * 4 + 4))
    eager = ModelRunner(model, cfg, graphs=False)
    for t, L in prompt_rows:
        eager.execute(StepBatch(list(range(3, 3 + L - 1)), list(range(L - 1)), [L - 1], [L - 1], [t], [], [], [None]))
    torch.testing.assert_close(logits, eager.execute(step), atol=1e-5, rtol=1e-5)
