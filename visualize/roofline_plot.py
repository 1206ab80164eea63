"""Plotly rendering of the roofline: the roofs, measured points, analytic points at the roof."""
from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go

from minillm.engine.trace import StepTrace
from minillm.visualize.captions import set_caption, si
from minillm.visualize.palette import CURSOR_COLOR, KIND_COLORS
from minillm.visualize.roofline_view import RooflinePoint, RooflineView, Roofs, roofline_view

KINDS = ("prefill", "decode", "mixed", "verify")


def _hover(p: RooflinePoint) -> str:
    return (f"step {p.step} ({p.kind}): {p.num_seqs} seqs, {p.num_tokens} tokens<br>"
            f"intensity {p.intensity:.2f} FLOP/B ({p.bound}-bound)<br>"
            f"measured {si(p.measured, 'FLOP/s')}, at the roof {si(p.analytic, 'FLOP/s')} "
            f"({p.efficiency:.0%}{', above the roof: re-measure it' if p.above_roof else ''})<br>achieved {si(p.achieved_bandwidth, 'B/s')}, {p.duration_s * 1e3:.1f} ms")


def x_extent(view: RooflineView) -> tuple[float, float]:
    xs = [p.intensity for p in view.points] + [view.roofs.ridge]
    return min(xs) / 4, max(xs) * 4


def y_extent(view: RooflineView) -> tuple[float, float]:
    lo_x, _ = x_extent(view)
    ys = [p.measured for p in view.points if p.measured > 0] + [view.roofs.attainable(lo_x)]
    return min(ys) / 3, view.roofs.peak_flops * 3


def roof_traces(view: RooflineView) -> list[go.BaseTraceType]:
    r = view.roofs
    lo, hi = x_extent(view)
    xs = [lo, r.ridge, max(hi, r.ridge * 1.01)]
    return [go.Scatter(x=xs, y=[r.attainable(x) for x in xs], mode="lines", name="roof (measured)",
                       line=dict(color="#222", width=2), hoverinfo="skip")]


def point_traces(view: RooflineView) -> list[go.BaseTraceType]:
    """Per kind: measured points; then analytic points, their connectors, and the cursor ring."""
    traces: list[go.BaseTraceType] = []
    for kind in KINDS:
        pts = view.by_kind(kind)
        traces.append(go.Scatter(
            x=[p.intensity for p in pts], y=[p.measured for p in pts], mode="markers", name=f"{kind} (measured)",
            marker=dict(color=KIND_COLORS[kind], size=8, opacity=0.85), hovertext=[_hover(p) for p in pts],
            hovertemplate="%{hovertext}<extra></extra>", legendgroup=kind,
        ))
    pts = view.points
    traces.append(go.Scatter(
        x=[p.intensity for p in pts], y=[p.analytic for p in pts], mode="markers", name="analytic (at the roof)",
        marker=dict(symbol="circle-open", size=8, color=[KIND_COLORS[p.kind] for p in pts], line=dict(width=1.5)),
        hovertext=[_hover(p) for p in pts], hovertemplate="%{hovertext}<extra></extra>",
    ))
    cx, cy = [], []
    for p in pts:  # the gap between a step and its roof: None breaks the line between segments
        cx += [p.intensity, p.intensity, None]
        cy += [p.measured, p.analytic, None]
    traces.append(go.Scatter(x=cx, y=cy, mode="lines", line=dict(color="#bbb", width=1), hoverinfo="skip",
                             showlegend=False, name="gap"))
    cur = view.current
    traces.append(go.Scatter(
        x=[cur.intensity] if cur else [], y=[cur.measured] if cur else [], mode="markers", name="cursor step",
        marker=dict(symbol="circle-open", size=18, color=CURSOR_COLOR, line=dict(width=3)),
        hovertext=[_hover(cur)] if cur else [], hovertemplate="%{hovertext}<extra></extra>",
    ))
    return traces


def roofline_axes(view: RooflineView) -> tuple[dict, dict]:
    lo, hi = x_extent(view)
    ylo, yhi = y_extent(view)
    # one labelled tick per decade, SI prefixes (100G, not 100B)
    x = dict(type="log", title_text="arithmetic intensity (FLOP / byte moved)", range=[math.log10(lo), math.log10(hi)],
             dtick=1, exponentformat="power")
    y = dict(type="log", title_text="FLOP / s", range=[math.log10(ylo), math.log10(yhi)], dtick=1, exponentformat="SI")
    return x, y


def roofline_caption(view: RooflineView) -> str:
    r = view.roofs
    head = (f"roofs{' (' + r.label + ')' if r.label else ''}: {si(r.bandwidth, 'B/s')}, "
            f"{si(r.peak_flops, 'FLOP/s')}, ridge at {r.ridge:.1f} FLOP/B")
    cur = view.current
    lines = [head]
    if cur is not None:
        lines.append(f"step {cur.step} ({cur.kind}, {cur.num_seqs} seqs): {cur.intensity:.2f} FLOP/B, "
                     f"{si(cur.measured, 'FLOP/s')} = {cur.efficiency:.1%} of its roof")
    above = view.above_roof
    if above:
        worst = max(above, key=lambda p: p.efficiency)
        lines.append(f"{len(above)} step{'s' if len(above) > 1 else ''} ran above the roof (up to {worst.efficiency:.0%}, "
                     f"step {worst.step}): a roof is an upper bound, so it was measured too low for this run "
                     "(load, threads); re-measure: minillm roofline --remeasure")
    return "<br>".join(lines)


def roofline_figure(trace: Sequence[StepTrace] | RooflineView, roofs: Roofs | None = None,
                    step: int | None = None) -> go.Figure:
    if isinstance(trace, RooflineView):
        view = trace
    else:
        if roofs is None:
            raise ValueError("pass the machine's roofs (minillm.visualize.machine_roofs())")
        view = roofline_view(trace, roofs, step)
    fig = go.Figure(roof_traces(view) + point_traces(view))
    x, y = roofline_axes(view)
    fig.update_xaxes(x)
    fig.update_yaxes(y)
    fig.update_layout(height=480, margin=dict(l=10, r=10, b=40), legend=dict(x=1.02, y=1, yanchor="top"),
                      plot_bgcolor="white", meta="minillm-roofline")
    fig.update_xaxes(showgrid=True, gridcolor="#eee")
    fig.update_yaxes(showgrid=True, gridcolor="#eee")
    set_caption(fig, roofline_caption(view), extra=14)
    return fig
