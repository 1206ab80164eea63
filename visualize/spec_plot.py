"""Plotly rendering of one step's speculation (spec_view.py): guesses as a tree, the accepted path, the target's token."""
from __future__ import annotations

from typing import Callable, Sequence

import plotly.graph_objects as go

from minillm.engine.trace import StepTrace
from minillm.visualize.fit import fit_title
from minillm.visualize.spec_view import SpecTreeView, spec_tree_view
from minillm.visualize.trace_index import clamp_step
from minillm.visualize.widgets import placeholder

NODE_STYLE = {  # kind -> (legend name, colour, symbol)
    "root": ("newest token", "#222222", "circle"),
    "accepted": ("guess accepted", "#54a24b", "circle"),
    "rejected": ("guess rejected", "#bab0ac", "circle-open"),
    "target": ("target's own token", "#b279a2", "diamond"),
}
MAX_SEQS = 4  # a tree per sequence; more would not be readable in one panel
META = "minillm-spec"  # names the panel in the page (the browser tests find views by it)


def _named(fig: go.Figure) -> go.Figure:
    fig.update_layout(meta=META)
    return fig


def spec_traces(view: SpecTreeView) -> list[go.BaseTraceType]:
    traces: list[go.BaseTraceType] = []
    offset = 0.0
    ex, ey, shown = [], [], set()
    points: dict[str, list] = {k: [[], [], [], []] for k in NODE_STYLE}
    for tree in view.seqs[:MAX_SEQS]:
        at = {n.index: n for n in tree.nodes}
        for n in tree.nodes:
            if n.parent is not None:
                p = at[n.parent]
                ex += [p.depth, n.depth, None]
                ey += [-(offset + p.y), -(offset + n.y), None]
            xs, ys, labels, hovers = points[n.kind]
            xs.append(n.depth)
            ys.append(-(offset + n.y))
            labels.append(n.label if n.kind != "root" else tree.label)
            hovers.append(f"{tree.label}: {NODE_STYLE[n.kind][0]} {n.label!r} at depth {n.depth}")
        offset += 1 + max(n.y for n in tree.nodes)
    traces.append(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#cccccc", width=1), hoverinfo="skip",
                             showlegend=False))
    for kind, (name, color, symbol) in NODE_STYLE.items():
        xs, ys, labels, hovers = points[kind]
        traces.append(go.Scatter(x=xs, y=ys, mode="markers+text", text=labels, textposition="middle right",
                                 marker=dict(color=color, symbol=symbol, size=11, line=dict(width=1.5, color=color)),
                                 name=name, hovertext=hovers, hovertemplate="%{hovertext}<extra></extra>",
                                 showlegend=kind not in shown))
    return traces


def spec_tree_figure(trace: Sequence[StepTrace], step: int | None = None,
                     decode: Callable[[int], str] | None = None) -> go.Figure:
    """The guesses per speculating sequence (up to MAX_SEQS), left to right by position, at `step` or,
    when that step verified none (a prefill, the end of a run), at the latest step before it that did."""
    if not trace:
        return _named(placeholder("no engine steps yet: press Step"))
    cursor = clamp_step(trace, step)
    shown = next((i for i in range(cursor, -1, -1) if any(r.num_proposed for r in trace[i].spec)), None)
    if shown is None:
        return _named(placeholder(f"step {cursor}: no guesses verified yet"))
    view = spec_tree_view(trace, shown, decode)
    fig = go.Figure(spec_traces(view))
    acc = ", ".join(f"{t.label} {t.num_accepted}/{t.num_proposed}" for t in view.seqs[:MAX_SEQS])
    kind = "tree" if any(t.is_tree for t in view.seqs) else "chain"
    when = f"Step {view.step}" if shown == cursor else f"Step {view.step} (the latest with guesses before step {cursor})"
    fit_title(fig, f"{when}: guesses ({kind}) and what the target kept: accepted/proposed {acc}")
    fig.update_layout(meta=META,
                      xaxis=dict(title="positions after the newest token", dtick=1, rangemode="tozero"),
                      yaxis=dict(visible=False), height=140 + 26 * sum(1 + max(n.y for n in t.nodes)
                                                                       for t in view.seqs[:MAX_SEQS]),
                      margin=dict(l=20, r=20, b=40), legend=dict(orientation="h", y=-0.25))
    return fig
