"""View models of the step trace, on synthetic records and on a trace recorded from a tiny engine."""
from __future__ import annotations

import pytest

from minillm.engine.trace import Arrival, Finished, dump_trace, load_trace
from minillm.visualize import BlockState, Roofs, SeqState, block_table_view, roofline_view, timeline_view
from minillm.visualize.synthetic import make_step, sched
from tests.helpers.engine_utils import greedy, make_engine, run_to_completion, tiny_model

PREFIX = list(range(1, 9))  # two full blocks of 4 tokens


def record_trace():
    """r0 runs alone until its prompt blocks are cached, r1 shares them (ref count 2),
    then r2 and r3 overfill the 16-block pool so the scheduler preempts."""
    engine = make_engine(tiny_model(), num_blocks=16, block_size=4, max_num_seqs=8, max_num_batched_tokens=32)
    engine.add_request("r0", PREFIX + [20, 21, 22], greedy(20))
    engine.step()
    engine.step()
    engine.add_request("r1", PREFIX + [30, 31], greedy(20))
    engine.step()
    engine.add_request("r2", [40 + i for i in range(10)], greedy(24))
    engine.add_request("r3", [60 + i for i in range(9)], greedy(16))
    run_to_completion(engine)
    return engine.trace


@pytest.fixture(scope="module")
def trace():
    return record_trace()


# ----- block table -------------------------------------------------------------------
def test_shared_prefix_block_shows_ref_count_two(trace):
    step = next(i for i, r in enumerate(trace) if r.blocks_shared)
    view = block_table_view(trace, step)
    r0 = next(t for t in view.tables if t.request_id == "r0")
    r1 = next(t for t in view.tables if t.request_id == "r1")
    assert r0.physical[:2] == r1.physical[:2]  # the two prefix blocks are the same physical blocks
    for bid in r1.physical[:2]:
        cell = view.cells[bid]
        assert cell.ref_count == 2 and cell.state == BlockState.SHARED and cell.shared
        assert {sid for sid, _ in cell.owners} == {r0.seq_id, r1.seq_id}
    assert r1.shared[:2] == (True, True) and not any(r1.shared[2:])
    assert {c.block_id for c in view.shared_blocks} == set(r1.physical[:2])
    assert view.prefix_hit_tokens == 8


def test_preemption_appears_with_its_reason(trace):
    steps = [i for i, r in enumerate(trace) if r.preemptions]
    assert steps, "the workload should overfill the pool"
    view = block_table_view(trace, steps[0])
    rec = trace[steps[0]].preemptions[0]
    note = view.preemptions[0]
    assert note.reason == rec.reason and note.reason.startswith("kv_pool_full")
    assert note.num_blocks_freed == rec.num_blocks_freed > 0
    # the victim holds no blocks after the step, and its blocks went back to the pool
    assert all(t.seq_id != note.seq_id for t in view.tables)
    tl = timeline_view(trace, steps[0])
    assert tl.state(note.seq_id, steps[0]) == SeqState.PREEMPTED
    ev = [e for e in tl.events if e.kind == "preempted" and e.step == steps[0]]
    assert ev and ev[0].detail == rec.reason


def test_pool_cells_match_the_record(trace):
    for i, rec in enumerate(trace):
        view = block_table_view(trace, i)
        assert view.num_used == rec.num_used_blocks
        assert [c.ref_count for c in view.cells] == list(rec.block_ref_counts)
        for k, bid in enumerate(rec.free_queue):
            assert view.cells[bid].free_position == k
            assert view.cells[bid].state in (BlockState.FREE, BlockState.CACHED_FREE)
        for sid, blocks in rec.block_tables:
            assert view.table(sid).physical == blocks
        assert set(view.allocated) == set(rec.blocks_allocated)
        assert 0.0 < view.utilization <= 1.0 or not view.tables


def test_cached_free_blocks_and_eviction_order():
    # block 1 and 2 are free; 2 still holds a cached prefix; 1 is handed out first
    rec = make_step(0, num_blocks=4, block_tables={0: (0,), 1: (3,)}, cached=[2], free_queue=(1, 2))
    view = block_table_view([rec])
    states = [c.state for c in view.cells]
    assert states == [BlockState.USED, BlockState.FREE, BlockState.CACHED_FREE, BlockState.USED]
    assert view.cells[2].free_position == 1 and view.num_cached_free == 1
    rec2 = make_step(1, num_blocks=4, block_tables={0: (0, 1), 1: (3, 2)}, allocated=(1, 2), evicted=(2,))
    view2 = block_table_view([rec, rec2])
    assert view2.cells[2].evicted and view2.cells[2].allocated and not view2.cells[1].evicted


def test_views_survive_a_jsonl_round_trip(trace, tmp_path):
    path = tmp_path / "trace.jsonl"
    dump_trace(trace, str(path))
    again = load_trace(str(path))
    for i in (0, len(trace) // 2, len(trace) - 1):
        assert block_table_view(again, i) == block_table_view(trace, i)
    assert timeline_view(again) == timeline_view(trace)


# ----- timeline ------------------------------------------------------------------------
def test_timeline_states_and_token_counts(trace):
    tl = timeline_view(trace)
    assert [r.request_id for r in tl.rows] == ["r0", "r1", "r2", "r3"]
    r0 = tl.rows[0]
    assert tl.states[0][0] == SeqState.PREFILL and tl.states[0][1] == SeqState.DECODE
    assert r0.arrival_step == 0 and r0.finish_reason == "length"
    # r1 is not in the timeline before it arrived, and nothing is shown after a sequence finished
    assert tl.states[1][0] is None and tl.states[1][2] == SeqState.PREFILL
    for row, states in zip(tl.rows, tl.states):
        assert all(s is None for s in states[row.finish_step + 1:])
    for tok, rec in zip(tl.tokens, trace):
        assert (tok.prefill, tok.decode, tok.spec, tok.budget) == (
            rec.num_prefill_tokens, rec.num_decode_tokens, rec.num_spec_tokens, rec.token_budget)
        assert tok.total <= tok.budget and tok.num_seqs == len(rec.scheduled)


def test_timeline_waiting_stalled_and_finished_cells():
    arrive = Arrival("a", (0,), 0.0, 4), Arrival("b", (1,), 0.0, 4)
    steps = [
        make_step(0, arrivals=arrive, block_tables={0: (0,)}, scheduled=(sched(0, "prefill", 4, 0, 4, "a"),)),
        # b holds a block but gets no tokens this step: "holds KV, not scheduled"
        make_step(1, block_tables={0: (0, 1), 1: (2,)}, scheduled=(sched(0, "decode", 1, 4, 4, "a"),)),
        make_step(2, block_tables={1: (2,)}, finished=(Finished(0, "a", "abort", 1),)),
    ]
    tl = timeline_view(steps)
    assert tl.states[0] == (SeqState.PREFILL, SeqState.DECODE, SeqState.FINISHED)
    assert tl.states[1] == (SeqState.WAITING, SeqState.STALLED, SeqState.STALLED)
    assert tl.rows[0].finish_step == 2 and tl.rows[0].finish_reason == "abort"


def test_timeline_upto_and_cursor(trace):
    tl = timeline_view(trace, cursor=3, upto=5)
    assert tl.num_steps == 6 and tl.cursor == 3 and len(tl.tokens) == 6
    assert all(len(row) == 6 for row in tl.states)


# ----- roofline ------------------------------------------------------------------------
ROOFS = Roofs(bandwidth=20e9, peak_flops=1e12)


def test_roofline_point_lands_where_counted_flops_and_bytes_put_it():
    rec = make_step(0, flops=3e9, bytes_moved=1e9, duration_s=0.5)
    (p,) = roofline_view([rec], ROOFS).points
    assert p.intensity == pytest.approx(3.0)  # FLOP / byte
    assert p.measured == pytest.approx(6e9)  # FLOP / s
    assert p.analytic == pytest.approx(60e9)  # under the bandwidth roof: 20 GB/s * 3 FLOP/B
    assert p.bound == "memory" and p.efficiency == pytest.approx(0.1)
    big = make_step(1, flops=1e12, bytes_moved=1e9, duration_s=2.0)  # 1000 FLOP/B: right of the ridge (50)
    q = roofline_view([rec, big], ROOFS).points[1]
    assert q.analytic == pytest.approx(1e12) and q.bound == "compute"
    assert ROOFS.ridge == pytest.approx(50.0)
    assert ROOFS.time_at_roof(1e12, 1e9) == pytest.approx(1.0)


def test_a_point_above_its_roof_is_flagged_and_explained():
    # a roof is an upper bound: a step measured faster than it means the roof is wrong for this run
    # (the demo's report once said a prefill step ran at "111.7% of its roof" and nothing more)
    from minillm.visualize.roofline_plot import roofline_caption, roofline_figure

    under = make_step(0, flops=3e9, bytes_moved=1e9, duration_s=0.5)  # 10% of its 60 GFLOP/s roof
    over = make_step(1, flops=1e12, bytes_moved=1e9, duration_s=0.8952)  # 1.117 TFLOP/s under a 1 TFLOP/s roof
    view = roofline_view([under, over], ROOFS, cursor=0)
    assert [p.above_roof for p in view.points] == [False, True]
    assert [p.step for p in view.above_roof] == [1]
    caption = roofline_caption(view)
    assert "1 step ran above the roof (up to 112%, step 1)" in caption and "re-measure" in caption
    assert "above the roof" not in roofline_caption(roofline_view([under], ROOFS))
    fig = roofline_figure(view)
    assert any("above the roof" in t for tr in fig.data if tr.hovertext for t in tr.hovertext)


def test_roofline_points_from_a_recorded_trace(trace):
    view = roofline_view(trace, ROOFS, cursor=5)
    worked = [i for i, r in enumerate(trace) if r.flops > 0]
    assert [p.step for p in view.points] == worked
    assert view.current is not None and view.current.step == 5
    for p in view.points:
        rec = trace[p.step]
        assert p.intensity == pytest.approx(rec.flops / rec.bytes_moved)
        assert p.measured == pytest.approx(rec.flops / rec.duration_s)
        assert p.analytic == pytest.approx(min(ROOFS.peak_flops, ROOFS.bandwidth * p.intensity))
        assert p.analytic >= 0 and p.kind in ("prefill", "decode", "mixed")


def test_decode_moves_right_as_the_batch_grows(trace):
    """Same weights read, more tokens computed: intensity grows with the decode batch."""
    pts = [p for p in roofline_view(trace, ROOFS).points if p.kind == "decode"]
    by_batch: dict[int, float] = {}
    for p in pts:
        by_batch.setdefault(p.num_seqs, p.intensity)
    sizes = sorted(by_batch)
    assert len(sizes) >= 2
    assert by_batch[sizes[-1]] > by_batch[sizes[0]]


def test_step_kinds():
    steps = [
        make_step(0, scheduled=(sched(0, "prefill", 4, 0, 4),), flops=1, bytes_moved=1),
        make_step(1, scheduled=(sched(0, "decode", 1, 4, 4), sched(1, "prefill", 4, 0, 8)), flops=1, bytes_moved=1),
        make_step(2, scheduled=(sched(0, "verify", 3, 5, 4),), flops=1, bytes_moved=1),
        make_step(3),  # nothing ran: no point
    ]
    view = roofline_view(steps, ROOFS, cursor=3)
    assert [p.kind for p in view.points] == ["prefill", "mixed", "verify"]
    assert view.current is None


def test_machine_roofs_reads_the_cached_measurement(monkeypatch):
    """The roofline's roofs come from minillm.roofline (read-only): the bandwidth roof and matmul FLOP/s."""
    import minillm.roofline as roofline
    from minillm.roofline import Measurement, Roofs as MeasuredRoofs
    from minillm.visualize.roofs import machine_roofs

    asked = {}

    def fake_get_roofs(device="cpu", remeasure=False, dtypes=("float32",), **kw):
        asked.update(device=str(device), dtypes=tuple(dtypes))
        return MeasuredRoofs(machine={"device_name": "test cpu"}, bandwidth=Measurement.of("B/s", [2e10]),
                             read_bandwidth=Measurement.of("B/s", [2e10]), copy_bandwidth=Measurement.of("B/s", [1e10]),
                             matmul={"bfloat16": Measurement.of("FLOP/s", [5e11])}, measured_at=0.0)

    monkeypatch.setattr(roofline, "get_roofs", fake_get_roofs)
    r = machine_roofs("cpu", "bfloat16")
    assert (r.bandwidth, r.peak_flops) == (2e10, 5e11) and "test cpu" in r.label
    assert asked == {"device": "cpu", "dtypes": ("bfloat16",)}


def test_machine_roofs_judges_a_model_with_its_own_products(monkeypatch):
    """machine_roofs(model_config=...) asks for the model's prefill GEMM shapes; remeasure and
    wait_quiet_s reach the measurement (notebook 01 re-measures once when a point sits above its roof)."""
    import minillm.roofline as roofline
    from minillm.roofline import Measurement, Roofs as MeasuredRoofs
    from minillm.roofline.roofs import model_gemm_shapes
    from minillm.visualize.roofs import machine_roofs
    from tests.helpers.engine_utils import tiny_model

    asked = {}

    def fake_get_roofs(device="cpu", remeasure=False, dtypes=("float32",), **kw):
        asked.update(remeasure=remeasure, **kw)
        return MeasuredRoofs(machine={"device_name": "test cpu"}, bandwidth=Measurement.of("B/s", [2e10]),
                             read_bandwidth=Measurement.of("B/s", [2e10]), copy_bandwidth=Measurement.of("B/s", [1e10]),
                             matmul={"float32": Measurement.of("FLOP/s", [5e11])}, measured_at=0.0)

    monkeypatch.setattr(roofline, "get_roofs", fake_get_roofs)
    cfg = tiny_model().config
    machine_roofs("cpu", "float32", model_config=cfg, remeasure=True, wait_quiet_s=60)
    assert asked == {"remeasure": True, "extra_shapes": model_gemm_shapes(cfg, 512), "wait_quiet_s": 60}
    asked.clear()
    machine_roofs("cpu", "float32")  # no model: the cached roof as it is, no waiting
    assert asked == {"remeasure": False, "extra_shapes": ()}
