"""All three views in one static plotly figure sharing one step cursor.

The report animates this figure over steps (plotly frames); the book shows it
at chosen steps. `DashboardLayout` remembers which traces and axes belong to
which view so a frame can update just the parts that change with the cursor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm.engine.trace import StepTrace
from minillm.visualize import block_plot as bf
from minillm.visualize import roofline_plot as rf
from minillm.visualize import timeline_plot as tf
from minillm.visualize.block_view import block_table_view
from minillm.visualize.captions import caption_annotation, caption_margin
from minillm.visualize.fit import BOOK_WIDTH, MIN_FONT, legend_px, legend_rows_px
from minillm.visualize.roofline_view import Roofs, roofline_view
from minillm.visualize.timeline_view import timeline_view
from minillm.visualize.trace_index import clamp_step


@dataclass
class DashboardLayout:
    pool: list[int]  # trace indices
    queue: list[int]
    tables: list[int]
    cursor_ring: list[int]
    tables_yaxis: str  # layout key, e.g. "yaxis3"
    tables_xaxis: str
    timeline_xref: str  # "x4"
    timeline_yrefs: tuple[str, str]
    fit: bf.PoolFit  # the pool panels' cells at the book's width (frames draw them the same)


COLUMN_WIDTHS = (0.55, 0.45)
HORIZONTAL_SPACING = 0.08


def dashboard_caption(trace: Sequence[StepTrace], step: int, roofs: Roofs) -> str:
    b = block_table_view(trace, step)
    t = timeline_view(trace, step)
    r = roofline_view(trace, roofs, step)
    return "<br>".join([bf.block_caption(b), tf.timeline_caption(t), rf.roofline_caption(r)])


def dashboard_figure(trace: Sequence[StepTrace], roofs: Roofs, step: int | None = None) -> go.Figure:
    """The three views at `step` in one figure, its legend below the plots: the panels get the book's width."""
    return build_dashboard(trace, roofs, step, legend_below=True)[0]


def build_dashboard(trace: Sequence[StepTrace], roofs: Roofs, step: int | None = None,
                    legend_below: bool = False) -> tuple[go.Figure, DashboardLayout]:
    """The dashboard figure and where its parts are (for animating it); the legend on the right unless below."""
    step = clamp_step(trace, step)
    b = block_table_view(trace, step)
    t = timeline_view(trace, step)
    r = roofline_view(trace, roofs, step)
    names = bf.legend_names() + [tr.name for tr in rf.roof_traces(r) + rf.point_traces(r) + tf.grid_traces(t)
                                 + tf.legend_traces() + tf.token_traces(t) if tr.showlegend is not False]
    plot_px = BOOK_WIDTH - 20 - (0 if legend_below else legend_px(names, MIN_FONT))
    fit = bf.PoolFit(b.num_blocks, plot_px * (1 - HORIZONTAL_SPACING) * COLUMN_WIDTHS[0])
    pool_rows = -(-b.num_blocks // fit.columns)
    max_tables = max(len(rec.block_tables) for rec in trace)  # room for the busiest step
    heights = [max(pool_rows, 3), 1, max(max_tables, 3), max(len(t.rows), 3), 4]
    caption = dashboard_caption(trace, step, roofs)
    height = int(420 + 20 * sum(heights))
    # ~48 px between panels whatever the height: tick labels and the next panel's title must both fit
    spacing = min(0.1, 48 / max(height - caption_margin(caption) - 40, 200))
    fig = make_subplots(
        rows=5, cols=2, column_widths=list(COLUMN_WIDTHS), row_heights=heights, vertical_spacing=spacing,
        horizontal_spacing=HORIZONTAL_SPACING,
        specs=[[{}, {"rowspan": 3}], [{}, None], [{}, None], [{"colspan": 2}, None], [{"colspan": 2}, None]],
        subplot_titles=("KV block pool (id×refs)", "roofline", "free queue (next out: left)",
                        "block table per sequence", "sequence state per step", "tokens per step"),
    )

    def add(traces, row, col) -> list[int]:
        first = len(fig.data)
        for tr in traces:
            fig.add_trace(tr, row=row, col=col)
        return list(range(first, len(fig.data)))

    pool = add(bf.pool_traces(b, fit), 1, 1)
    add(bf.legend_traces(), 1, 1)
    queue = add(bf.queue_traces(b, fit), 2, 1)
    tables = add(bf.table_traces(b, fit), 3, 1)
    add(rf.roof_traces(r), 1, 2)
    points = add(rf.point_traces(r), 1, 2)
    add(tf.grid_traces(t) + tf.legend_traces(), 4, 1)
    add(tf.token_traces(t), 5, 1)
    for row, col, (xa, ya) in ((1, 1, bf.pool_axes(b)), (2, 1, bf.queue_axes(b, fit)), (3, 1, bf.table_axes(b, fit)),
                               (1, 2, rf.roofline_axes(r)), (4, 1, tf.grid_axes(t)), (5, 1, tf.token_axes(t))):
        fig.update_xaxes(xa, row=row, col=col)
        fig.update_yaxes(ya, row=row, col=col)
    fig.update_xaxes(title_text=None, row=3, col=1)  # the grid below needs the room
    fig.update_xaxes(showgrid=True, gridcolor="#eee", row=1, col=2)
    fig.update_yaxes(showgrid=True, gridcolor="#eee", row=1, col=2)
    grid_x = fig.get_subplot(4, 1).xaxis.plotly_name.replace("axis", "")
    fig.update_xaxes(matches=grid_x, row=5, col=1)  # one step axis for both timeline panels
    layout = DashboardLayout(
        pool=pool, queue=queue, tables=tables, cursor_ring=[points[-1]],
        tables_yaxis=fig.get_subplot(3, 1).yaxis.plotly_name, tables_xaxis=fig.get_subplot(3, 1).xaxis.plotly_name,
        timeline_xref=grid_x,
        timeline_yrefs=(fig.get_subplot(4, 1).yaxis.plotly_name.replace("axis", ""),
                        fig.get_subplot(5, 1).yaxis.plotly_name.replace("axis", "")),
        fit=fit,
    )
    legend = dict(x=1.02, y=1, yanchor="top", traceorder="grouped", font=dict(size=MIN_FONT))
    below = 0
    if legend_below:  # in the bottom margin, under the step axis's title, flowing over the whole width
        below = legend_rows_px(names, MIN_FONT)
        plot_h = height - caption_margin(caption) - 40  # the panels' px (the margins grow by `below` alike)
        legend = dict(orientation="h", x=0, xanchor="left", y=-65 / plot_h, yanchor="top",
                      traceorder="normal", font=dict(size=MIN_FONT))
        for a in fig.layout.annotations[4:6]:  # the full-width panels' titles: left, clear of the roofline's axis title
            a.update(x=0, xanchor="left")
    fig.update_layout(
        barmode="stack", bargap=0.1, height=height + below, plot_bgcolor="white",
        margin=dict(l=10, r=10, b=40 + (30 + below if below else 0), t=caption_margin(caption)),
        meta="minillm-dashboard", legend=legend,
        shapes=tf.cursor_shapes(step, layout.timeline_xref, layout.timeline_yrefs),
    )
    fig.add_annotation(caption_annotation(caption))
    return fig, layout


def dashboard_frame(trace: Sequence[StepTrace], roofs: Roofs, step: int, layout: DashboardLayout,
                    subplot_titles: Sequence[go.layout.Annotation]) -> go.Frame:
    """What changes when the cursor moves to `step`: pool, queue, tables, cursor marks, captions."""
    b = block_table_view(trace, step)
    r = roofline_view(trace, roofs, step)
    data = (bf.pool_traces(b, layout.fit) + bf.queue_traces(b, layout.fit) + bf.table_traces(b, layout.fit)
            + [rf.point_traces(r)[-1]])
    idx = layout.pool + layout.queue + layout.tables + layout.cursor_ring
    xa, ya = bf.table_axes(b, layout.fit)
    xa.pop("title_text", None)
    caption = dashboard_caption(trace, step, roofs)
    return go.Frame(
        name=str(step), data=data, traces=idx,
        layout={
            layout.tables_yaxis: ya, layout.tables_xaxis: {"range": xa["range"], "dtick": xa["dtick"]},
            "shapes": tf.cursor_shapes(step, layout.timeline_xref, layout.timeline_yrefs),
            "annotations": list(subplot_titles) + [caption_annotation(caption)],
        },
    )
