"""Pipeline parallelism (layers split into stages) on the tiny 2-layer Llama: pp=2 vs one rank."""
from __future__ import annotations

import signal

import pytest
import torch

from minillm import LLM
from tests.test_parallel_tiny import (ENGINE, VOCAB, break_worker_mid_run, recording_logits,  # noqa: F401
                                      reference, scenario, tiny_folder)

pytestmark = pytest.mark.slow  # two worker processes (~12 s of CPU)


@pytest.fixture(scope="module")
def pp_run(tiny_folder):
    with LLM(tiny_folder, pipeline_parallel_size=2, **ENGINE) as llm:
        stage = llm.engine.model.pp_stage
        assert stage.layers == (0, 1) and len(llm.engine.model.layers) == 1  # rank 0 keeps layer 0 only
        ex = llm.engine.executor
        workers = list(ex.workers)
        # rank 0's pool holds its stage's one layer: 128 blocks x 4 slots x (K, V) x 4 KV heads x 8 x fp32
        assert ex.kv_cache_bytes == 128 * 4 * 2 * 4 * 8 * 4
        with recording_logits(ex) as logits:
            tokens = scenario(llm)
        trace = llm.trace
    return tokens, torch.cat(logits), trace, workers


def test_pp2_matches_one_rank(pp_run, reference):
    tokens, logits, trace, workers = pp_run
    ref_tokens, ref_logits, ref_trace = reference
    assert tokens == ref_tokens
    # each stage runs whole layers in the same order as one rank: the same sums up to the BLAS's
    # summation order, which depends on each process's thread count (bit-exact with 1 thread everywhere)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    assert [t.num_tokens for t in trace] == [t.num_tokens for t in ref_trace]
    assert sum(t.prefix_hit_tokens for t in trace) >= 12
    assert not any(p.is_alive() for p in workers)


def test_pp_trace_counts_what_rank0_sends_and_receives(pp_run):
    _, _, trace, _ = pp_run
    hidden, fp32 = 64, 4
    for t in trace:
        rows = sum(s.sampled for s in t.scheduled)
        # rank 0 sends the hidden state and the residual to stage 1, and gets the sampled rows' logits back
        assert t.p2p_bytes == 2 * t.num_tokens * hidden * fp32 + rows * VOCAB * fp32
        assert t.allreduce_bytes == t.allgather_bytes == 0


def test_pp_killed_stage_raises_a_clear_error(tiny_folder):
    msg, elapsed, workers = break_worker_mid_run(signal.SIGKILL, 10.0, tiny_folder, "pipeline_parallel_size")
    assert "rank 1" in msg and "died" in msg, msg
    assert elapsed < 10.0 + 5
    assert not any(p.is_alive() for p in workers)
