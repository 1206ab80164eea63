"""Tensor parallelism end to end on a tiny random Llama (8 query / 4 KV heads): tp=2 and tp=4 vs one rank.

Each TP engine starts worker processes (forked here: no CUDA in this process; each
worker still loads the model), so every engine is built once per module and all checks
read its recorded run. Logits are compared at the sampler's input (what the executor
returns to the engine): tp changes only the order of floating-point sums, so they agree
to float32 rounding.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from unittest import mock

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.parallel.executor import TensorParallelError
from tests.helpers.tiny_models import make_tiny_hf_model

LOGITS_ATOL = 1e-4  # float32; measured max difference 4.5e-6 on logits up to ~6
pytestmark = pytest.mark.slow  # starts 7 worker processes in all (~40 s of CPU)
VOCAB = 338  # not a multiple of 4: the vocab-parallel shards need padding at tp=4
ENGINE = dict(block_size=4, num_kv_blocks=128, max_num_batched_tokens=16, seed=0)
SHARED = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]  # 3 full blocks: a prefix-cache hit later


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder, _ = make_tiny_hf_model(tmp_path_factory.mktemp("tp"), "llama", num_attention_heads=8,
                                   num_key_value_heads=4, vocab_size=VOCAB)
    return str(folder)


@contextmanager
def recording_logits(executor):
    """Record every logits tensor `executor` (an engine's Executor) hands back: what the sampler reads."""
    seen: list[torch.Tensor] = []
    real = executor.execute

    def spy(batch):
        logits = real(batch)
        if logits is not None:
            seen.append(logits.detach().clone())
        return logits

    with mock.patch.object(executor, "execute", spy):
        yield seen


def scenario(llm: LLM) -> list[list[int]]:
    """Batched prompts (one longer than the 16-token budget: chunked prefill), then a shared-prefix request."""
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = [SHARED + [30, 31], list(range(40, 70)), [5, 6, 7]]
    out = [o.outputs[0].token_ids for o in llm.generate(first, sp, use_tqdm=False)]
    out += [o.outputs[0].token_ids for o in llm.generate([SHARED + [99, 98, 97]], sp, use_tqdm=False)]
    return out


@pytest.fixture(scope="module")
def reference(tiny_folder):
    llm = LLM(tiny_folder, **ENGINE)
    with recording_logits(llm.engine.executor) as logits:
        tokens = scenario(llm)
    return tokens, torch.cat(logits), llm.trace


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"tp{n}")
def tp_run(request, tiny_folder):
    n = request.param
    with LLM(tiny_folder, tensor_parallel_size=n, **ENGINE) as llm:
        ex = llm.engine.executor
        workers = list(ex.workers)
        assert len(workers) == n - 1 and all(p.is_alive() for p in workers)
        assert ex.start_method == "fork"  # Linux, no CUDA here (test_parallel_unguarded_main.py: why)
        # rank 0's pool: 128 blocks x 4 slots x (K, V) x 2 layers x its 4/n KV heads x head_dim 8 x fp32
        assert ex.plan.num_blocks == 128 and ex.kv_cache_bytes == 128 * 4 * 2 * 2 * (4 // n) * 8 * 4
        with recording_logits(ex) as logits:
            tokens = scenario(llm)
        trace = llm.trace
    return n, tokens, torch.cat(logits), trace, workers


def test_greedy_tokens_and_logits_match_one_rank(tp_run, reference):
    n, tokens, logits, _, _ = tp_run
    ref_tokens, ref_logits, _ = reference
    assert tokens == ref_tokens
    assert logits.shape == ref_logits.shape == (logits.shape[0], VOCAB)
    err = (logits - ref_logits).abs().max().item()
    assert err < LOGITS_ATOL, f"tp={n}: max |logit difference| {err:.2e}"


def test_chunked_prefill_and_prefix_caching_still_happen(tp_run, reference):
    _, _, _, trace, _ = tp_run
    ref_trace = reference[2]
    chunked = [s for t in trace for s in t.scheduled if s.phase == "prefill" and not s.sampled]
    assert chunked, "the 30-token prompt should be split over steps by the 16-token budget"
    hits = sum(t.prefix_hit_tokens for t in trace)
    assert hits == sum(t.prefix_hit_tokens for t in ref_trace) >= 12
    assert [t.num_tokens for t in trace] == [t.num_tokens for t in ref_trace]  # same schedule step by step


def test_trace_counts_the_collectives_analytically(tp_run, tiny_folder):
    n, _, _, trace, _ = tp_run
    layers, hidden, fp32 = 2, 64, 4
    padded_vocab = -(-VOCAB // n) * n
    for t in trace:
        rows = sum(s.sampled for s in t.scheduled)
        # 2 all-reduces per layer (o_proj, down_proj) + 1 after the embedding, tokens x hidden each
        assert t.allreduce_bytes == (2 * layers + 1) * t.num_tokens * hidden * fp32 > 0
        assert t.allgather_bytes == rows * padded_vocab * fp32  # the LM head's logits
        assert t.comm_time_s > 0


def test_workers_are_gone_after_close(tp_run):
    workers = tp_run[4]
    assert all(not p.is_alive() for p in workers)
    import torch.distributed as dist

    assert not dist.is_initialized()  # a next TP engine can start in this process


def break_worker_mid_run(sig: int, timeout_s: float, folder: str, size: str = "tensor_parallel_size"
                         ) -> tuple[str, float, list]:
    """Send `sig` to rank 1 after a few steps of a long generation; (the error, seconds to it, workers)."""
    llm = LLM(folder, **{size: 2}, distributed_timeout_s=timeout_s, **ENGINE)
    worker = llm.engine.executor.workers[0]

    def strike():
        while len(llm.trace) < 3:  # mid-run: some steps done
            time.sleep(0.005)
        os.kill(worker.pid, sig)

    threading.Thread(target=strike, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(TensorParallelError) as err:
        llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=400, ignore_eos=True), use_tqdm=False)
    elapsed = time.monotonic() - t0
    with pytest.raises(TensorParallelError, match="down"):  # and it stays down, no hang
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)
    llm.close()
    return str(err.value), elapsed, llm.engine.executor.workers


def test_killed_worker_raises_a_clear_error(tiny_folder):
    msg, elapsed, workers = break_worker_mid_run(signal.SIGKILL, 10.0, tiny_folder)
    assert "rank 1" in msg and "died" in msg, msg
    assert elapsed < 10.0 + 5  # within the timeout (plus the reaping pause)
    assert all(not p.is_alive() for p in workers)


@pytest.mark.slow
def test_hung_worker_raises_within_the_timeout(tiny_folder):
    msg, elapsed, workers = break_worker_mid_run(signal.SIGSTOP, 3.0, tiny_folder)
    assert "did not answer within 3 s" in msg, msg
    assert 2.5 < elapsed < 3.0 + 5
    assert all(not p.is_alive() for p in workers)  # the stopped worker was killed, not left behind


def test_an_unclosed_engine_is_reaped_when_dropped(tiny_folder):
    import gc

    import torch.distributed as dist

    llm = LLM(tiny_folder, tensor_parallel_size=2, **ENGINE)
    workers = list(llm.engine.executor.workers)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)
    del llm
    gc.collect()
    for p in workers:
        p.join(timeout=10)
    assert not any(p.is_alive() for p in workers)
    assert not dist.is_initialized()


def test_an_interrupted_step_takes_the_engine_down_cleanly(tiny_folder):
    """Ctrl-C in the middle of a step leaves the workers inside a collective: refuse to go on."""
    calls = []

    def interrupted(batch):
        calls.append(batch)
        raise KeyboardInterrupt

    with LLM(tiny_folder, tensor_parallel_size=2, **ENGINE) as llm:
        ex = llm.engine.executor
        workers = list(ex.workers)
        # rank 0's forward, after the batch went out: the workers are already inside the step
        with mock.patch.object(ex.runner, "execute", interrupted), pytest.raises(KeyboardInterrupt):
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)
        assert calls and not any(p.is_alive() for p in workers)
        with pytest.raises(TensorParallelError, match="half-done"):
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)


def test_threads_of_a_dead_process_group_make_the_next_engine_spawn(tiny_folder, monkeypatch):
    """A child forked while an earlier group's gloo threads still run may block on their locks
    (a CI run: the worker forked after the hung-worker test never loaded): spawn instead."""
    from minillm.parallel import executor as executor_mod

    monkeypatch.setattr(executor_mod, "_process_group_threads", lambda: ["pt_gloo_runloop", "gloo_tcp_loop"])
    with LLM(tiny_folder, tensor_parallel_size=2, **ENGINE) as llm:
        ex = llm.engine.executor
        assert ex.start_method == "spawn"
        assert "earlier process group" in ex._start_why and "pt_gloo_runloop" in ex._start_why
        out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


def test_a_dead_process_group_in_a_cycle_is_collected_before_fork(tiny_folder):
    """The CI hang, reproduced: a failed engine's gloo group sat in a reference cycle; the forked
    worker's garbage collector freed it and ~ProcessGroupGloo waited for threads the child lacks.
    Rank 0 now collects it first (then forks, the group's threads gone)."""
    import gc

    import torch.distributed as dist

    from minillm.parallel.executor import _process_group_threads
    from minillm.parallel.group import free_port, init_group

    gc.disable()  # keep the cycle until the engine's own collection
    try:
        init_group(0, 1, free_port(), torch.device("cpu"), 10.0)
        cycle = [dist.group.WORLD]
        cycle.append(cycle)
        dist.destroy_process_group()
        del cycle
        assert _process_group_threads(), "the group in the cycle should still have its threads"
        with LLM(tiny_folder, tensor_parallel_size=2, distributed_startup_timeout_s=120, **ENGINE) as llm:
            assert llm.engine.executor.start_method == "fork", llm.engine.executor._start_why
            out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 3
    finally:
        gc.enable()
