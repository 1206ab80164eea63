"""Static renderings: every view renders every step with a fixed set of traces; the report is offline."""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("plotly")

from minillm.visualize import Roofs
from minillm.visualize.block_plot import block_table_figure
from minillm.visualize.dashboard_plot import build_dashboard, dashboard_figure
from minillm.visualize.report import frame_steps, report_figure, write_html_report
from minillm.visualize.roofline_plot import roofline_figure
from minillm.visualize.show import figure_bundle
from minillm.visualize.timeline_plot import timeline_figure
from tests.test_visualize_views import record_trace

ROOFS = Roofs(bandwidth=20e9, peak_flops=1e12, label="test")


@pytest.fixture(scope="module")
def trace():
    return record_trace()


def test_each_view_renders_every_step_with_stable_traces(trace):
    shapes = {"block": set(), "timeline": set(), "roofline": set()}
    for i in range(len(trace)):
        for name, fig in (("block", block_table_figure(trace, i)), ("timeline", timeline_figure(trace, i)),
                          ("roofline", roofline_figure(trace, ROOFS, i))):
            shapes[name].add(tuple(t.type for t in fig.data))
            assert fig.layout.meta == f"minillm-{'block-table' if name == 'block' else name}"
    # one trace layout per view whatever the step: the live widget restyles traces in place
    assert all(len(s) == 1 for s in shapes.values()), shapes


def test_block_figure_names_preemption_reason_in_its_caption(trace):
    step = next(i for i, r in enumerate(trace) if r.preemptions)
    fig = block_table_figure(trace, step)
    caption = next(a.text for a in fig.layout.annotations if a.name == "caption")
    assert "PREEMPTED" in caption and trace[step].preemptions[0].reason in caption


def test_block_figure_marks_shared_cells(trace):
    step = next(i for i, r in enumerate(trace) if r.blocks_shared)
    pool = block_table_figure(trace, step).data[0]
    bid = trace[step].blocks_shared[0]
    cols = len(pool.z[0])
    assert pool.z[bid // cols][bid % cols] == 3  # BlockState.SHARED
    assert pool.text[bid // cols][bid % cols] == f"{bid}×2"


def test_roofline_figure_puts_points_at_intensity_and_rate(trace):
    fig = roofline_figure(trace, ROOFS, 4)
    decode = next(t for t in fig.data if t.name == "decode (measured)")
    recs = [r for r in trace if r.flops > 0 and r.num_prefill_tokens == 0]
    assert list(decode.x) == pytest.approx([r.flops / r.bytes_moved for r in recs])
    assert list(decode.y) == pytest.approx([r.flops / r.duration_s for r in recs])
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_dashboard_figure_and_static_bundle(trace):
    fig, layout = build_dashboard(trace, ROOFS, 3)
    assert dashboard_figure(trace, ROOFS, 3).layout.meta == "minillm-dashboard"
    assert fig.data[layout.pool[0]].type == "heatmap"
    assert fig.data[layout.cursor_ring[0]].name == "cursor step"
    bundle = figure_bundle(fig)
    assert "application/vnd.plotly.v1+json" in bundle and "Plotly.newPlot" in bundle["text/html"]
    json.dumps(bundle["application/vnd.plotly.v1+json"])  # serialisable for the notebook


def test_frame_steps():
    assert frame_steps(5, 10) == [0, 1, 2, 3, 4]
    picked = frame_steps(1000, 50)
    assert picked[0] == 0 and picked[-1] == 999 and len(picked) == 50


def test_report_is_self_contained_and_animated(trace, tmp_path):
    path = write_html_report(trace, tmp_path / "report.html", roofs=ROOFS)
    html = path.read_text()
    # plotly.js is inline: no script is fetched from anywhere
    assert not re.search(r"<script[^>]+src=", html)
    assert "Plotly.addFrames" in html or '"frames"' in html
    fig = report_figure(trace, ROOFS)
    assert len(fig.frames) == len(trace)
    assert [s.label for s in fig.layout.sliders[0].steps] == [str(i) for i in range(len(trace))]
    step = next(i for i, r in enumerate(trace) if r.preemptions)
    caption = fig.frames[step].layout.annotations[-1].text
    assert trace[step].preemptions[0].reason in caption


def test_report_rejects_an_empty_trace(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        write_html_report([], tmp_path / "r.html", roofs=ROOFS)


def test_figures_render_steps_that_did_no_work():
    """An idle step (nothing scheduled) has no roofline point; every view still renders."""
    from minillm.visualize.synthetic import make_step

    idle = [make_step(0), make_step(1)]
    assert roofline_figure(idle, ROOFS, 1).data[-1].x == ()  # no cursor ring without a point
    assert block_table_figure(idle, 0).data[0].type == "heatmap"
    assert timeline_figure(idle, 1).layout.meta == "minillm-timeline"
    build_dashboard(idle, ROOFS, 0)
