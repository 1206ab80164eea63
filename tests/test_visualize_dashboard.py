"""The live dashboard and its controller, driven from Python (the browser test clicks the real page)."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")  # plotly's FigureWidget is an anywidget

from minillm.visualize import Dashboard, Roofs
from tests.helpers.engine_utils import greedy, make_engine, tiny_model

ROOFS = Roofs(bandwidth=20e9, peak_flops=1e12)


def busy_engine():
    engine = make_engine(tiny_model(), num_blocks=16, block_size=4, max_num_seqs=4, max_num_batched_tokens=16)
    for i in range(5):
        engine.add_request(f"r{i}", [3 + i] * (6 + i), greedy(6 + 2 * i))
    return engine


def pool_z(dash):
    return [list(r) for r in dash.block_table.widget.data[0].z]


def test_step_button_steps_the_engine_and_redraws_every_view():
    engine = busy_engine()
    dash = Dashboard(engine, roofs=ROOFS)
    assert dash.cursor is None and not engine.trace
    dash.controller.step_button.click()  # what a click in the page does
    assert len(engine.trace) == 1 and dash.cursor == 0
    z0, rows0 = pool_z(dash), dash.timeline.widget.data[0].z
    dash.controller.step_button.click()
    dash.controller.step_button.click()
    assert len(engine.trace) == 3 and dash.cursor == 2 and dash.controller.slider.max == 2
    assert pool_z(dash) != z0  # decode grew the block tables
    assert len(dash.timeline.widget.data[0].z[0]) == 3 and len(rows0[0]) == 1
    assert dash.roofline.widget.data[-1].x  # the cursor ring sits on the newest step
    assert "step 2 of 2" in dash.controller.status.value


def test_slider_scrubs_recorded_steps_without_stepping():
    engine = busy_engine()
    dash = Dashboard(engine, roofs=ROOFS)
    dash.step(6)
    last = pool_z(dash)
    dash.controller.slider.value = 1  # the reader drags the slider
    assert len(engine.trace) == 6 and dash.block_table.last_step == 1 and dash.timeline.last_step == 1
    assert pool_z(dash) != last
    shapes = dash.timeline.widget.layout.shapes
    assert shapes[0].x0 == 1  # the cursor line moved


def test_run_until_done_and_pause():
    engine = busy_engine()
    dash = Dashboard(engine, roofs=ROOFS, interval_s=0.0)
    ran = asyncio.run(dash.run(max_steps=3))
    assert ran == 3 and dash.controller.run_button.description == "Run"

    async def run_then_pause():
        task = asyncio.ensure_future(dash.run())
        await asyncio.sleep(0)  # let it take a step
        dash.controller.pause()  # what clicking Pause does
        return await task

    ran = asyncio.run(run_then_pause())
    assert ran >= 1 and engine.has_unfinished_requests()
    asyncio.run(dash.run())
    assert not engine.has_unfinished_requests() and dash.cursor == len(engine.trace) - 1
    assert dash.step() == 0  # nothing left to do


def test_run_button_toggle_starts_a_task_on_the_running_loop():
    engine = busy_engine()
    dash = Dashboard(engine, roofs=ROOFS, interval_s=0.0)

    async def click_run():
        dash.controller.run_button.value = True  # the page's Run click
        assert dash.controller._task is not None
        await dash.controller._task

    asyncio.run(click_run())
    assert not engine.has_unfinished_requests() and not dash.controller.run_button.value


def test_from_trace_scrubs_a_recording():
    engine = busy_engine()
    while engine.has_unfinished_requests():
        engine.step()
    dash = Dashboard.from_trace(engine.trace, roofs=ROOFS)
    assert dash.controller.step_button.disabled and dash.cursor == len(engine.trace) - 1
    dash.show(0)
    assert dash.block_table.last_step == 0


def synced_state(widget) -> dict:
    """What a view opened now draws: the widget's synced state, as the browser receives it (strict JSON)."""
    import json

    state = widget.get_state()
    return json.loads(json.dumps({"data": state["_widget_data"], "layout": state["_widget_layout"]}, allow_nan=False))


def test_a_view_opened_after_edits_draws_the_current_figure():
    # Notebook 09 builds its dashboard on an engine that already ran: the views are edited before the
    # browser shows them, and a view draws from the synced state, not from the edits sent earlier.
    engine = busy_engine()
    for _ in range(3):
        engine.step()
    dash = Dashboard(engine, roofs=ROOFS)
    dash.step()
    for live in (dash.block_table, dash.timeline, dash.roofline):
        state = synced_state(live.widget)
        assert len(state["data"]) == len(live.widget.data) > 0
        assert state["layout"]["meta"] == live.widget.layout.meta
        for drawn, trace in zip(state["data"], live.widget.data):
            assert drawn["type"] == trace.type and drawn.get("name") == trace.name
            assert "marker" not in drawn or isinstance(drawn["marker"], dict)
    assert len(synced_state(dash.timeline.widget)["data"][0]["z"][0]) == 4  # every step, the newest included


def test_nan_reaches_a_widget_as_a_gap():
    # a masked heatmap cell is NaN; widget state is strict JSON (notebook 04's tile explorer)
    import math

    import plotly.graph_objects as go

    from minillm.visualize.widgets import figure_widget, json_safe, sync_figure

    fig = go.Figure(go.Heatmap(z=[[1.0, math.nan], [float("-inf"), 2.0]]))
    widget = figure_widget(fig)
    assert synced_state(widget)["data"][0]["z"] == [[1.0, None], [None, 2.0]]
    sync_figure(widget, go.Figure(go.Heatmap(z=[[math.nan, 3.0], [4.0, 5.0]])))
    assert synced_state(widget)["data"][0]["z"] == [[None, 3.0], [4.0, 5.0]]
    import numpy as np

    assert json_safe({"a": np.array([1.0, np.nan]), "b": (np.float32("inf"), 2)}) == {"a": [1.0, None], "b": [None, 2]}


def test_a_dashboard_rebuilt_on_a_finished_engine_shows_its_trace_and_why_step_does_nothing():
    # re-running a dashboard cell after the run: the views must show the recorded steps (not the
    # "press Step" placeholder) and the status must say why Step has nothing to do
    engine = busy_engine()
    while engine.has_unfinished_requests():
        engine.step()
    dash = Dashboard(engine, roofs=ROOFS)
    assert dash.step() == 0
    state = synced_state(dash.timeline.widget)
    assert len(state["data"][0]["z"][0]) == len(engine.trace)
    assert not any("press Step" in a.get("text", "") for a in state["layout"].get("annotations", []))
    assert "nothing to do until requests are added" in dash.controller.status.value
