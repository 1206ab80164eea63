"""Plotly rendering of the scheduler's lanes (lanes_view.py): the queues at the cursor and per-lane counts per step."""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm.engine.trace import StepTrace
from minillm.visualize.captions import set_caption
from minillm.visualize.fit import MIN_FONT
from minillm.visualize.lanes_view import LanesView, lanes_view
from minillm.visualize.palette import CURSOR_COLOR
from minillm.visualize.widgets import placeholder

LANE_COLORS = {"short": "#54a24b", "long": "#4c78a8", "queue": "#4c78a8"}
OTHER_COLORS = ("#e45756", "#f58518", "#b279a2", "#72b7b2", "#9d755d", "#bab0ac")  # priority lanes, in order
WAITING_OPACITY = 0.35  # a waiting request is its lane's colour, faded; a running one is solid
MAX_WAITING = 24  # per lane drawn at the cursor; the caption counts the rest
META = "minillm-lanes"  # names the panel in the page (the browser tests find views by it)


def _named(fig: go.Figure) -> go.Figure:
    fig.update_layout(meta=META)
    return fig


def lane_color(view: LanesView, lane: str) -> str:
    if lane in LANE_COLORS:
        return LANE_COLORS[lane]
    return OTHER_COLORS[view.lanes.index(lane) % len(OTHER_COLORS)]


def queue_traces(view: LanesView) -> list[go.BaseTraceType]:
    """One row per lane: waiting requests left of x = 0 (the head nearest it), seats right of it."""
    traces: list[go.BaseTraceType] = []
    for y, lane in enumerate(view.lanes):
        color = lane_color(view, lane)
        for running, entries in ((False, view.waiting(lane)[:MAX_WAITING]), (True, view.running(lane))):
            xs = [e.position + 1 if running else -(e.position + 1) for e in entries]
            hover = []
            for e in entries:
                where = f"running (seat {e.position + 1} of its lane)" if running else f"waiting, #{e.position + 1} in line"
                head = f"<br>head of its lane since step {e.head_since}" if e.head_since is not None else ""
                hover.append(f"{e.request_id} (seq {e.seq_id}), lane {lane}, priority {e.priority}<br>{where}, "
                             f"arrived in step {e.arrival_step}{head}")
            traces.append(go.Scatter(
                x=xs or [None], y=[y] * len(xs) or [None], mode="markers+text", text=[e.request_id for e in entries] or [""],
                textposition="top center", textfont=dict(size=MIN_FONT), hovertext=hover or [None],
                hovertemplate="%{hovertext}<extra></extra>", name=f"{lane}: {'running' if running else 'waiting'}",
                legendgroup=lane, marker=dict(symbol="square", size=16, color=color,
                                              opacity=1.0 if running else WAITING_OPACITY,
                                              line=dict(width=1, color="#333" if running else color))))
    return traces


def count_traces(view: LanesView) -> list[go.BaseTraceType]:
    """Per step, per lane: running (solid) and waiting (faded) stacked; max_num_seqs as a dashed line."""
    steps = [c.step for c in view.counts]
    traces: list[go.BaseTraceType] = []
    for running in (True, False):
        for k, lane in enumerate(view.lanes):
            ys = [(c.running if running else c.waiting)[k] for c in view.counts]
            state = "running" if running else "waiting"
            traces.append(go.Bar(x=steps, y=ys, name=f"{lane} {state} (per step)", legendgroup=lane, showlegend=False,
                                 marker=dict(color=lane_color(view, lane), opacity=1.0 if running else WAITING_OPACITY),
                                 hovertemplate=f"step %{{x}}: %{{y}} {state} in {lane}<extra></extra>"))
    traces.append(go.Scatter(x=steps, y=[view.max_num_seqs] * len(steps), mode="lines", name="seats (max_num_seqs)",
                             line=dict(color="#444", dash="dash", shape="hv"),
                             hovertemplate="max_num_seqs %{y}<extra></extra>"))
    return traces


def lanes_caption(view: LanesView) -> str:
    parts = []
    for lane in view.lanes:
        w, r = view.waiting(lane), view.running(lane)
        head = ""
        if w and w[0].head_since is not None and w[0].head_since <= view.step:
            head = f" (head {w[0].request_id} since step {w[0].head_since}: {view.step - w[0].head_since + 1} steps)"
        parts.append(f"{lane}: {len(w)} waiting{head}, {len(r)} running")
    seats = sum(len(view.running(lane)) for lane in view.lanes)
    return (f"after step {view.step}, policy {view.policy}: " + "; ".join(parts)
            + f"<br>seats taken {seats}/{view.max_num_seqs}; waiting requests left of the line, the head nearest it")


def lanes_figure(trace: Sequence[StepTrace], step: int | None = None) -> go.Figure:
    """The lanes after `step` (top) and every step's waiting / running counts per lane with a cursor (bottom)."""
    if not trace:
        return _named(placeholder("no engine steps yet: press Step"))
    view = lanes_view(trace, step)
    n = len(view.lanes)
    fig = make_subplots(rows=2, cols=1, row_heights=[max(n, 2), 3], vertical_spacing=0.14,
                        subplot_titles=("queues after the step: waiting | seats", "requests per lane per step"))
    for tr in queue_traces(view):
        fig.add_trace(tr, row=1, col=1)
    for tr in count_traces(view):
        fig.add_trace(tr, row=2, col=1)
    widest = max([len(view.waiting(lane)[:MAX_WAITING]) for lane in view.lanes] + [1])
    fig.update_xaxes(range=[-widest - 0.8, view.max_num_seqs + 0.8], zeroline=True, zerolinecolor="#222",
                     zerolinewidth=2, showticklabels=False, row=1, col=1)
    fig.update_yaxes(tickmode="array", tickvals=list(range(n)), ticktext=list(view.lanes), range=[n - 0.4, -0.6],
                     row=1, col=1)
    fig.update_xaxes(title_text="engine step", range=[-0.5, len(view.counts) - 0.5], row=2, col=1)
    fig.update_yaxes(title_text="requests", rangemode="tozero", row=2, col=1)
    fig.update_layout(
        barmode="stack", bargap=0.05, height=int(340 + 40 * n), plot_bgcolor="white", meta=META,
        margin=dict(l=10, r=10, b=40), legend=dict(x=1.02, y=1, yanchor="top", font=dict(size=MIN_FONT)),
        shapes=[dict(type="line", xref="x2", x0=view.step, x1=view.step, yref="y2 domain", y0=0, y1=1,
                     line=dict(color=CURSOR_COLOR, width=2), name="cursor")])
    set_caption(fig, lanes_caption(view))
    return fig
