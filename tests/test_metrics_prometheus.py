"""The Prometheus view counts exactly what the step trace says (tiny random model, no server)."""
from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from minillm.metrics.from_trace import request_timelines
from minillm.metrics.prometheus import TraceMetrics
from minillm.sampling_params import SamplingParams
from tests.helpers.engine_utils import greedy, make_engine, random_prompts, tiny_model

M = {"model_name": "tiny"}


@pytest.fixture(scope="module")
def trace():
    """A run with prefix hits, preemptions, an n=2 request and an abort, recorded once."""
    engine = make_engine(tiny_model(), num_blocks=24, block_size=4, max_num_seqs=8, max_num_batched_tokens=32)
    shared = list(range(1, 17))  # four full blocks, shared by two requests -> prefix hits
    engine.add_request("first", shared + [20, 21], greedy(6))
    for _ in range(3):
        engine.step()
    engine.add_request("again", shared + [30, 31, 32], greedy(6))
    for i, p in enumerate(random_prompts(7, 97, 5, 20, seed=3)):
        engine.add_request(f"r{i}", p, greedy(12))
    pair = SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=8, ignore_eos=True)
    engine.add_request("pair", [5, 6, 7, 8, 9], pair)
    engine.add_request("gone", [9, 8, 7, 6, 5, 4], greedy(30))
    for _ in range(4):
        engine.step()
    engine.abort_request("gone")
    steps = 0
    while engine.has_unfinished_requests() and steps < 500:
        engine.step()
        steps += 1
    engine.step()  # an empty step still reports anything pending
    assert not engine.has_unfinished_requests()
    return list(engine.trace)


def value(metrics: TraceMetrics, name: str, **labels: str) -> float:
    v = metrics.registry.get_sample_value(name, M | labels)
    assert v is not None, name
    return v


def test_trace_exercises_everything(trace):
    assert sum(len(r.preemptions) for r in trace) > 0
    assert sum(r.prefix_hit_tokens for r in trace) > 0
    assert any(f.reason == "abort" for r in trace for f in r.finished)


def test_counts_equal_the_trace(trace):
    metrics = TraceMetrics("tiny")
    metrics.observe(trace)
    assert metrics.num_records == len(trace)
    tls = request_timelines(trace)
    started = [tl for tl in tls.values() if tl.token_times]

    generated = sum(len(n.token_ids) for r in trace for n in r.new_tokens)
    assert value(metrics, "minillm:generation_tokens_total") == generated
    assert value(metrics, "minillm:prompt_tokens_total") == sum(tl.num_prompt_tokens for tl in started)
    assert value(metrics, "minillm:num_preemptions_total") == sum(len(r.preemptions) for r in trace)
    assert value(metrics, "minillm:prefix_cache_queries_total") == sum(r.prefix_queried_tokens for r in trace)
    assert value(metrics, "minillm:prefix_cache_hits_total") == sum(r.prefix_hit_tokens for r in trace)

    ttft = [tl.ttft for tl in started]
    assert value(metrics, "minillm:time_to_first_token_seconds_count") == len(ttft)
    assert math.isclose(value(metrics, "minillm:time_to_first_token_seconds_sum"), sum(ttft), rel_tol=1e-9)
    itl = [x for tl in tls.values() for x in tl.inter_token_latencies]
    assert value(metrics, "minillm:time_per_output_token_seconds_count") == len(itl)
    assert math.isclose(value(metrics, "minillm:time_per_output_token_seconds_sum"), sum(itl), rel_tol=1e-9)
    queue = [tl.queue_time for tl in tls.values() if tl.queue_time is not None]
    assert value(metrics, "minillm:request_queue_time_seconds_count") == len(queue)
    assert math.isclose(value(metrics, "minillm:request_queue_time_seconds_sum"), sum(queue), rel_tol=1e-9)

    # every request finished (the aborted one too); n=2 ends with its last sequence
    assert value(metrics, "minillm:e2e_request_latency_seconds_count") == len(tls)
    ends = {}
    for r in trace:
        for f in r.finished:
            ends[f.request_id] = r.start_time + r.duration_s
    e2e = [ends[rid] - tl.arrival_time for rid, tl in tls.items()]
    assert math.isclose(value(metrics, "minillm:e2e_request_latency_seconds_sum"), sum(e2e), rel_tol=1e-9)
    for reason in ("stop", "length", "abort"):
        want = sum(1 for tl in tls.values() if tl.finish_reason == reason)
        assert value(metrics, "minillm:request_success_total", finished_reason=reason) == want
    assert value(metrics, "minillm:request_success_total", finished_reason="abort") == 1

    busy = [r.num_tokens for r in trace if r.num_tokens]
    assert value(metrics, "minillm:iteration_tokens_total_count") == len(busy)
    assert value(metrics, "minillm:iteration_tokens_total_sum") == sum(busy)

    last = trace[-1]
    assert value(metrics, "minillm:num_requests_running") == last.num_running
    assert value(metrics, "minillm:num_requests_waiting") == last.num_waiting
    assert value(metrics, "minillm:kv_cache_usage_perc") == last.kv_usage


def test_incremental_equals_at_once(trace):
    once, pieces = TraceMetrics("tiny"), TraceMetrics("tiny")
    once.observe(trace)
    for i in range(0, len(trace), 5):
        pieces.observe(trace[i : i + 5])
    a = {(s.name, tuple(sorted(s.labels.items()))): s.value
         for f in once.registry.collect() for s in f.samples if not s.name.endswith("_created")}
    b = {(s.name, tuple(sorted(s.labels.items()))): s.value
         for f in pieces.registry.collect() for s in f.samples if not s.name.endswith("_created")}
    assert a == b


def test_exposition_parses_and_uses_own_registry(trace):
    metrics = TraceMetrics("tiny")
    metrics.observe(trace[:3])
    text = generate_latest(metrics.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("minillm:num_requests_running", "minillm:num_requests_waiting", "minillm:kv_cache_usage_perc",
                 "minillm:prefix_cache_queries", "minillm:prefix_cache_hits", "minillm:num_preemptions",
                 "minillm:prompt_tokens", "minillm:generation_tokens", "minillm:request_success",
                 "minillm:time_to_first_token_seconds", "minillm:time_per_output_token_seconds",
                 "minillm:e2e_request_latency_seconds", "minillm:request_queue_time_seconds",
                 "minillm:iteration_tokens_total"):
        assert name in families, name
    # two servers in one process must not collide in the global registry
    TraceMetrics("tiny")


def test_fresh_metrics_show_zeros():
    text = generate_latest(TraceMetrics("m").registry).decode()
    assert 'minillm:generation_tokens_total{model_name="m"} 0.0' in text
    assert 'minillm:request_success_total{finished_reason="abort",model_name="m"} 0.0' in text
