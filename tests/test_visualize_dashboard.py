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
