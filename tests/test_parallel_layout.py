"""Tensor parallelism without processes: who holds what, the bad sizes, the analytic model, old traces, start method."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from minillm.config import ModelConfig
from minillm.engine.trace import StepTrace, load_trace
from minillm.parallel import analytic
from minillm.parallel.pipeline import check_pp_size, stage_layers
from minillm.parallel.shard import check_tp_size, gate_up_rows, qkv_rows, rank_shard

TINY = ModelConfig(vocab_size=338, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=8, num_key_value_heads=4)
SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3)


@pytest.mark.parametrize("cfg,size", [(TINY, 2), (TINY, 4), (TINY, 8), (TINY, 1), (SMOLLM2, 3)])
def test_shards_cover_the_model_once(cfg, size):
    shards = [rank_shard(cfg, r, size) for r in range(size)]
    heads = [h for s in shards for h in range(*s.q_heads)]
    assert heads == list(range(cfg.num_attention_heads))  # every query head on exactly one rank
    assert [c for s in shards for c in range(*s.mlp_cols)] == list(range(cfg.intermediate_size))
    assert [v for s in shards for v in range(*s.vocab_rows)] == list(range(cfg.vocab_size))
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    for s in shards:
        # each rank's query heads attend with the KV heads it holds (GQA grouping kept)
        assert {h // group for h in range(*s.q_heads)} == set(range(*s.kv_heads))
        assert s.vocab_rows_padded * size >= cfg.vocab_size
    kv_holders = [k for s in shards for k in range(*s.kv_heads)]
    replicas = max(1, size // cfg.num_key_value_heads)
    assert sorted(kv_holders) == sorted(list(range(cfg.num_key_value_heads)) * replicas)
    assert all(s.kv_replicas == replicas for s in shards)


def test_fused_weight_rows_of_a_rank():
    s = rank_shard(TINY, 1, 2)  # query heads 4..7, KV heads 2..3, head_dim 8
    rows = qkv_rows(TINY, s).tolist()
    assert rows[:32] == list(range(32, 64))  # q
    assert rows[32:48] == list(range(64 + 16, 64 + 32))  # k starts after the 64 q rows
    assert rows[48:] == list(range(96 + 16, 96 + 32))  # v after the 32 k rows
    assert gate_up_rows(TINY, s).tolist() == list(range(64, 128)) + list(range(192, 256))


@pytest.mark.parametrize("size,what", [(3, "query heads"), (0, ">= 1"), (6, "KV heads")])
def test_bad_sizes_are_refused(size, what):
    cfg = TINY if size != 6 else dataclasses.replace(TINY, num_attention_heads=12, num_key_value_heads=4,
                                                      intermediate_size=120)
    with pytest.raises(ValueError, match=what):
        check_tp_size(cfg, size)


def test_bad_size_is_refused_by_llm_before_loading():
    from minillm import LLM

    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(tensor_parallel_size=0)


def test_analytic_model_counts_and_orders():
    cfg = analytic.LLAMA2_7B
    assert analytic.allreduce_payload_bytes(cfg, 64, 2) == 65 * 64 * 4096 * 2
    one = analytic.estimate_step(cfg, analytic.DECODE_64, 1, analytic.H100_SXM, analytic.NVLINK4)
    assert one.comm_s == 0 and one.allreduce_bytes == 0
    nv = analytic.estimate_step(cfg, analytic.DECODE_64, 4, analytic.H100_SXM, analytic.NVLINK4)
    pcie = analytic.estimate_step(cfg, analytic.DECODE_64, 4, analytic.H100_SXM, analytic.PCIE5)
    assert nv.compute_s == pytest.approx(one.compute_s / 4)
    assert nv.comm_s < pcie.comm_s  # the same bytes over a slower link
    rows = analytic.speedup_table({"70B": analytic.LLAMA2_70B}, [analytic.PREFILL_2K], [1, 2, 8],
                                  [analytic.NVLINK4, analytic.PCIE5])
    by = {(r["link"], r["tp"]): r for r in rows}
    assert by[(analytic.NVLINK4.name, 8)]["speedup"] > by[(analytic.PCIE5.name, 8)]["speedup"] > 1
    assert not by[(analytic.NVLINK4.name, 1)]["fits"] and by[(analytic.NVLINK4.name, 2)]["fits"]
    with pytest.raises(ValueError):
        analytic.estimate_step(cfg, analytic.DECODE_1, 0, analytic.H100_SXM, analytic.NVLINK4)


def test_old_trace_without_comm_fields_loads(tmp_path):
    from tests.helpers.engine_utils import greedy, make_engine, run_to_completion, tiny_model

    engine = make_engine(tiny_model())
    engine.add_request("a", [1, 2, 3, 4, 5], greedy(3))
    run_to_completion(engine)
    old = []
    for t in engine.trace:
        d = t.to_dict()
        assert d["allreduce_bytes"] == 0 and d["comm_time_s"] == 0  # one rank communicates nothing
        for k in ("allreduce_bytes", "allgather_bytes", "comm_time_s", "p2p_bytes"):
            del d[k]
        old.append(d)
    path = tmp_path / "old.json"
    path.write_text("".join(json.dumps(d) + "\n" for d in old))  # JSONL, as dump_trace writes
    back = load_trace(str(path))
    assert [t.num_tokens for t in back] == [t.num_tokens for t in engine.trace]
    assert all(t.allreduce_bytes == 0.0 for t in back)
    assert StepTrace.from_dict(old[0]).allgather_bytes == 0.0


@pytest.mark.parametrize("layers,size", [(30, 2), (30, 4), (2, 2), (7, 3), (5, 5)])
def test_pipeline_stages_cover_the_layers_once_and_evenly(layers, size):
    stages = [stage_layers(layers, size, r) for r in range(size)]
    assert [i for a, b in stages for i in range(a, b)] == list(range(layers))
    counts = [b - a for a, b in stages]
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1


def test_bad_pipeline_sizes_are_refused():
    with pytest.raises(ValueError, match="exceeds the model's 2 layers"):
        check_pp_size(TINY, 3)
    from minillm import LLM

    with pytest.raises(ValueError, match="do not combine"):
        LLM(tensor_parallel_size=2, pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="pipeline_parallel_size must be"):
        LLM(pipeline_parallel_size=0)


def test_workers_fork_unless_cuda_is_initialised():
    """vLLM's rule: fork (no re-import of the main script), spawn once CUDA is initialised here."""
    import sys
    from unittest import mock

    from minillm.parallel import executor

    if sys.platform.startswith("linux") and not torch.cuda.is_initialized():
        assert executor.worker_start_method()[0] == "fork"
    with mock.patch.object(torch.cuda, "is_initialized", return_value=True):
        method, why = executor.worker_start_method()
    assert method == "spawn" and "CUDA" in why
