"""Plotly rendering of the batch timeline: sequences x steps, and token counts per step."""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm.engine.trace import StepTrace
from minillm.visualize.captions import set_caption
from minillm.visualize.palette import CURSOR_COLOR, SEQ_COLORS, SEQ_NAMES, TOKEN_COLORS, discrete_colorscale
from minillm.visualize.timeline_view import TimelineView, timeline_view

_SCALE = discrete_colorscale(SEQ_COLORS)


def grid_traces(view: TimelineView) -> list[go.BaseTraceType]:
    """Heatmap of states plus markers where a sequence finished or was preempted."""
    z = [[None if s is None else int(s) for s in row] for row in view.states] or [[None]]
    hover = [[f"{r.label} step {k}: {SEQ_NAMES[s]}" if s is not None else "" for k, s in enumerate(row)]
             for r, row in zip(view.rows, view.states)] or [[""]]
    row_of = {r.seq_id: i for i, r in enumerate(view.rows)}
    traces: list[go.BaseTraceType] = [go.Heatmap(
        z=z, hovertext=hover, hovertemplate="%{hovertext}<extra></extra>", colorscale=_SCALE, zmin=0,
        zmax=len(SEQ_COLORS) - 1, showscale=False, xgap=1, ygap=1, name="states",
    )]
    for kind, symbol, color in (("finished", "circle", "#2f6f2a"), ("preempted", "x", "#8b0000")):
        evs = [e for e in view.events if e.kind == kind and e.seq_id in row_of]
        traces.append(go.Scatter(
            x=[e.step for e in evs], y=[row_of[e.seq_id] for e in evs], mode="markers", name=kind,
            marker=dict(symbol=symbol, size=9, color=color, line=dict(width=1, color="white")),
            hovertext=[f"{view.rows[row_of[e.seq_id]].label} {kind} at step {e.step}: {e.detail}" for e in evs],
            hovertemplate="%{hovertext}<extra></extra>", legendgroup="events",
        ))
    return traces


def token_traces(view: TimelineView) -> list[go.BaseTraceType]:
    """Stacked prefill / decode / speculative tokens per step, and the token budget."""
    steps = [t.step for t in view.tokens]
    traces: list[go.BaseTraceType] = [
        go.Bar(x=steps, y=[getattr(t, kind) for t in view.tokens], name=f"{kind} tokens",
               marker_color=TOKEN_COLORS[kind], legendgroup="tokens",
               hovertemplate=f"step %{{x}}: %{{y}} {kind} tokens<extra></extra>")
        for kind in ("prefill", "decode", "spec")
    ]
    traces.append(go.Scatter(x=steps, y=[t.budget for t in view.tokens], mode="lines", name="token budget",
                             line=dict(color="#444", dash="dash", shape="hv"), legendgroup="tokens",
                             hovertemplate="budget %{y} tokens<extra></extra>"))
    masked = [t for t in view.tokens if t.grammar_rows]
    if masked:  # structured outputs: the steps whose rows a grammar masked, and what the masks cost
        traces.append(go.Scatter(x=[t.step for t in masked], y=[t.grammar_rows for t in masked], mode="markers",
                                 name="rows masked by a grammar", legendgroup="tokens",
                                 marker=dict(symbol="diamond-open", size=9, color="#7b3294"),
                                 customdata=[t.grammar_ms for t in masked],
                                 hovertemplate="step %{x}: %{y} rows masked, %{customdata:.2f} ms<extra></extra>"))
    return traces


def legend_traces() -> list[go.BaseTraceType]:
    return [go.Scatter(x=[None], y=[None], mode="markers", name=name, legendgroup="states",
                       marker=dict(symbol="square", size=12, color=color))
            for name, color in zip(SEQ_NAMES, SEQ_COLORS)]


def grid_axes(view: TimelineView) -> tuple[dict, dict]:
    n = max(1, len(view.rows))
    x = dict(showgrid=False, zeroline=False, range=[-0.5, max(view.num_steps, 1) - 0.5])
    y = dict(showgrid=False, zeroline=False, tickmode="array", tickvals=list(range(len(view.rows))),
             ticktext=[r.label for r in view.rows], range=[n - 0.5, -0.5], automargin=True)
    return x, y


def token_axes(view: TimelineView) -> tuple[dict, dict]:
    top = max([t.total for t in view.tokens] + [1])
    budget = max([t.budget for t in view.tokens] + [1])
    # the budget can dwarf small steps: show it only when steps come within a factor of 4 of it
    y = dict(title_text="tokens", range=[0, (budget if top * 4 >= budget else top) * 1.1], zeroline=False)
    x = dict(title_text="engine step", range=[-0.5, max(view.num_steps, 1) - 0.5])
    return x, y


def cursor_shapes(step: int, xref: str, yrefs: Sequence[str]) -> list[dict]:
    """A vertical line at the cursor step through each given subplot ('y', 'y2', ...)."""
    return [dict(type="line", xref=xref, x0=step, x1=step, yref=f"{y} domain", y0=0, y1=1,
                 line=dict(color=CURSOR_COLOR, width=2), name="cursor") for y in yrefs]


def timeline_caption(view: TimelineView) -> str:
    if not view.tokens:
        return "no steps yet"
    t = view.tokens[view.cursor]
    return (f"step {t.step}: {t.num_seqs}/{t.max_num_seqs} sequences scheduled, {t.total}/{t.budget} tokens "
            f"({t.prefill} prefill, {t.decode} decode" + (f", {t.spec} speculative" if t.spec else "") + ")")


def timeline_figure(trace: Sequence[StepTrace] | TimelineView, step: int | None = None) -> go.Figure:
    view = trace if isinstance(trace, TimelineView) else timeline_view(trace, step)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[max(len(view.rows), 3), 4],
                        vertical_spacing=0.1,
                        subplot_titles=("sequence state per step", "tokens per step vs the token budget"))
    for tr in grid_traces(view) + legend_traces():
        fig.add_trace(tr, row=1, col=1)
    for tr in token_traces(view):
        fig.add_trace(tr, row=2, col=1)
    for row, axes in ((1, grid_axes(view)), (2, token_axes(view))):
        fig.update_xaxes(axes[0], row=row, col=1)
        fig.update_yaxes(axes[1], row=row, col=1)
    fig.update_xaxes(showticklabels=True, row=1, col=1)
    fig.update_layout(
        barmode="stack", bargap=0.1, height=int(300 + 18 * max(len(view.rows), 3) + 120),
        margin=dict(l=10, r=10, b=40), shapes=cursor_shapes(view.cursor, "x", ("y", "y2")),
        legend=dict(x=1.02, y=1, yanchor="top", traceorder="grouped"), plot_bgcolor="white", meta="minillm-timeline",
    )
    set_caption(fig, timeline_caption(view))
    return fig
