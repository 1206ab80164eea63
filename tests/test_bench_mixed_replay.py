"""bench/mixed_replay.py: a mixed workload on the engine's step clock, on a tiny model."""
from __future__ import annotations

import pytest

from minillm.bench.mixed_replay import class_percentiles, replay, step_arrivals
from minillm.bench.serve_mixed import MixedWorkload
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.metrics import request_timelines
from tests.helpers.engine_utils import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

VOCAB = 97
WORKLOAD = MixedWorkload(num_short=8, num_long=3, short_prompt_len_range=(4, 10), short_output_len_range=(2, 5),
                         long_prompt_len_range=(4, 10), long_output_len_range=(16, 20), short_rate=0.3, long_rate=4.0)


def engine(policy: str, model) -> LLMEngine:
    return LLMEngine(model, None, [], EngineConfig(
        block_size=4, num_kv_blocks=128, max_num_seqs=3, max_num_batched_tokens=64, scheduling_policy=policy,
        short_lane_max_tokens=WORKLOAD.short_max_tokens, short_lane_share=0.34))


def test_arrivals_on_the_step_clock():
    arr = step_arrivals(WORKLOAD, VOCAB)
    sent = WORKLOAD.requests(VOCAB)
    assert [a.step for a in arr] == [int(t) for t, *_ in sent]
    assert [(a.prompt, a.max_tokens, a.cls) for a in arr] == [(p, n, c) for _, p, n, c, _ in sent]
    assert sorted(a.request_id for a in arr if a.cls == "short") == sorted(f"short-{i}" for i in range(8))
    assert arr == step_arrivals(WORKLOAD, VOCAB)  # seeded


def test_replay_records_match_the_trace():
    model = tiny_model(vocab=VOCAB)
    arr = {a.request_id: a for a in step_arrivals(WORKLOAD, VOCAB)}
    outs = {}
    for policy in ("fcfs", "length-aware"):
        e = engine(policy, model)
        recs = replay(e, list(arr.values()))
        assert sorted(r.request_id for r in recs) == sorted(arr)
        tls = request_timelines(e.trace)
        first_token = {}
        for j, rec in enumerate(e.trace):
            for t in rec.new_tokens:
                first_token.setdefault(t.seq_id, j)
        arrived = {a.request_id: j for j, rec in enumerate(e.trace) for a in rec.arrivals}
        for r in recs:
            a = arr[r.request_id]
            # added just before its step: never later, earlier only when the engine had run dry
            assert r.arrival_step == arrived[r.request_id] <= a.step
            sid = next(x.seq_ids[0] for rec in e.trace for x in rec.arrivals if x.request_id == r.request_id)
            assert r.first_token_step == first_token[sid] and len(r.token_ids) == a.max_tokens
            # the engine stamps the token inside its step; the trace at the step's end
            step_s = e.trace[r.first_token_step].duration_s
            assert tls[r.request_id].ttft - step_s <= r.ttft_s <= tls[r.request_id].ttft and r.ttft_steps >= 1
            assert r.e2e_steps >= r.ttft_steps + a.max_tokens - 1  # one token a step after the first
        pct = class_percentiles(recs)
        assert set(pct) == {"short", "long"} and pct["short"]["ttft_steps"]["p50"] >= 1
        outs[policy] = {r.request_id: r.token_ids for r in recs}
    assert outs["fcfs"] == outs["length-aware"]  # greedy: the policy changes when, not what
