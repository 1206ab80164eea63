"""The lanes view (visualize/lanes_view.py) and its figure, on mixed workloads replayed through tiny engines."""
from __future__ import annotations

import pytest

from minillm.bench.mixed_replay import replay, step_arrivals
from minillm.bench.serve_mixed import MixedWorkload
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.policy import LONG, SHORT
from minillm.engine.trace import StepTrace
from minillm.visualize import head_waits, lanes_view
from tests.helpers.engine_utils import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

VOCAB = 97
WAIT = 6  # long_lane_max_wait_steps: small, so the aging rule acts within the run
# four long generations take every seat under fcfs; the short chats keep coming
WORKLOAD = MixedWorkload(num_short=10, num_long=4, short_prompt_len_range=(4, 10), short_output_len_range=(2, 5),
                         long_prompt_len_range=(4, 10), long_output_len_range=(20, 24), short_rate=0.4, long_rate=4.0)


def run(policy: str, spy: bool = False) -> tuple[LLMEngine, list[dict[str, int | None]]]:
    e = LLMEngine(tiny_model(vocab=VOCAB), None, [], EngineConfig(
        block_size=4, num_kv_blocks=128, max_num_seqs=4, max_num_batched_tokens=64, scheduling_policy=policy,
        short_lane_max_tokens=WORKLOAD.short_max_tokens, short_lane_share=0.5, long_lane_max_wait_steps=WAIT))
    heads: list[dict[str, int | None]] = []
    if spy:  # the policy's own view of each lane's head at the start of every step: the ground truth
        policy_ = e.scheduler.policy
        begin = policy_.begin_step

        def begin_step(waiting, running):
            begin(waiting, running)
            heads.append({lane: next((s.seq_id for s in waiting if policy_.lane(s) == lane), None)
                          for lane in (SHORT, LONG)})
        policy_.begin_step = begin_step
    replay(e, step_arrivals(WORKLOAD, VOCAB))
    return e, heads


@pytest.fixture(scope="module")
def lanes():
    return run("length-aware", spy=True)


def test_view_matches_the_queues_in_the_trace(lanes):
    e, _ = lanes
    trace = e.trace
    policy = e.scheduler.policy
    assert any(sum(c.waiting) for c in lanes_view(trace).counts), "the workload was meant to build queues"
    for s, rec in enumerate(trace):
        view = lanes_view(trace, s)
        assert view.policy == "length-aware" and view.lanes == (SHORT, LONG) and view.step == s
        assert [(x.seq_id, x.running) for x in view.entries] == [(q.seq_id, q.running) for q in rec.queue]
        for lane in view.lanes:
            waiting = [q.seq_id for q in rec.queue if q.lane == lane and not q.running]
            assert [x.seq_id for x in view.waiting(lane)] == waiting  # the policy's order, head first
            assert [x.position for x in view.waiting(lane)] == list(range(len(waiting)))
            # only a lane's head says since when it is the head
            assert [x.head_since is not None for x in view.waiting(lane)] == [i == 0 for i in range(len(waiting))]
        c = view.counts[s]
        assert sum(c.waiting) + sum(c.running) == len(rec.queue) and sum(c.running) == rec.num_running
        assert sum(c.running) <= rec.max_num_seqs and c.running[1] <= policy.long_lane_seats
    # every step's counts are in every view, the same
    assert lanes_view(trace, 3).counts == lanes_view(trace).counts and len(lanes_view(trace).counts) == len(trace)
    # the view reads only the trace: the same after a JSON round trip
    again = [StepTrace.from_dict(r.to_dict()) for r in trace]
    assert lanes_view(again, 9) == lanes_view(trace, 9)


def test_head_waits_agree_with_the_policy_clock(lanes):
    e, heads = lanes
    assert len(heads) == len(e.trace)
    truth: dict[int, tuple[str, int]] = {}
    for j, at_start in enumerate(heads):
        for lane, sid in at_start.items():
            if sid is not None:
                truth.setdefault(sid, (lane, j))
    got = head_waits(e.trace)
    assert {h.seq_id: (h.lane, h.head_step) for h in got} == truth
    first_scheduled = {}
    for j, rec in enumerate(e.trace):
        for s in rec.scheduled:
            first_scheduled.setdefault(s.seq_id, j)
    assert all(h.admitted_step == first_scheduled[h.seq_id] for h in got)
    # the starvation bound of engine/policy.py, on this trace: N + R - 1 steps at the head of the long lane
    longest = max(a.max_tokens for a in step_arrivals(WORKLOAD, VOCAB))
    long_waits = [h.waited for h in head_waits(e.trace, LONG)]
    assert long_waits and max(long_waits) <= WAIT + longest - 1
    assert max(long_waits) > WAIT  # aging alone did not admit it: it waited for a long seat to free
    # lane filter
    assert {h.lane for h in head_waits(e.trace, SHORT)} == {SHORT}


def test_lanes_per_policy():
    fcfs, _ = run("fcfs")
    prio, _ = run("priority")
    assert lanes_view(fcfs.trace, 5).lanes == ("queue",)
    assert lanes_view(prio.trace, 5).lanes == ("priority 0", "priority 1")  # lower value served first, on top
    # fcfs: the four long generations hold every seat and the short chats queue behind them
    v = lanes_view(fcfs.trace, 10)
    assert [x.request_id.split("-")[0] for x in v.running("queue")] == ["long"] * 4 and v.waiting("queue")
    # priority: the short chats wait in their own lane, ahead of every waiting long one
    v = lanes_view(prio.trace, 10)
    assert all(x.priority == 0 for x in v.waiting("priority 0")) and v.waiting("priority 0")


def test_lanes_figure_and_dashboard_panel(lanes):
    pytest.importorskip("plotly")
    e, _ = lanes
    from minillm.visualize import lanes_figure

    fig = lanes_figure(e.trace, 10)
    view = lanes_view(e.trace, 10)
    assert fig.layout.meta == "minillm-lanes" and "after step 10, policy length-aware" in fig.layout.annotations[-1].text
    markers = {t.name: [x for x in t.x if x is not None] for t in fig.data if t.type == "scatter" and t.mode == "markers+text"}
    for lane in view.lanes:
        assert len(markers[f"{lane}: waiting"]) == len(view.waiting(lane))
        assert len(markers[f"{lane}: running"]) == len(view.running(lane))
        assert all(x < 0 for x in markers[f"{lane}: waiting"]) and all(x > 0 for x in markers[f"{lane}: running"])
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 2 * len(view.lanes) and all(len(b.x) == len(e.trace) for b in bars)
    assert [s.x0 for s in fig.layout.shapes if s.name == "cursor"] == [10]
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from minillm.visualize import Dashboard

    dash = Dashboard(e)
    assert dash.lanes is not None and dash.lanes.widget in dash.widget.children
    dash.show(4)
    assert dash.lanes.last_step == 4
    fcfs, _ = run("fcfs")
    assert Dashboard(fcfs).lanes is None  # one queue: the timeline already shows it
