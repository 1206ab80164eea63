"""Plotly rendering of the radix prefix cache (prefix_tree_view.py): token runs as bars, locked vs evictable."""
from __future__ import annotations

from typing import Callable, Sequence

import plotly.graph_objects as go

from minillm.engine.trace import StepTrace
from minillm.visualize.fit import MIN_FONT, fit_title
from minillm.visualize.prefix_tree_view import PrefixTreeView, prefix_tree_view
from minillm.visualize.trace_index import clamp_step
from minillm.visualize.widgets import placeholder

NODE_STYLE = {  # kind -> (legend name, colour)
    "locked": ("in use (locked: kept)", "#4c78a8"),
    "evictable": ("cached, evictable", "#f58518"),
}
MAX_NODES = 400  # beyond this a tree is not readable in one panel; the title says how many were left out
META = "minillm-prefix-tree"  # names the panel in the page (the browser tests find views by it)


def _named(fig: go.Figure) -> go.Figure:
    fig.update_layout(meta=META)
    return fig


def prefix_tree_traces(view: PrefixTreeView) -> list[go.BaseTraceType]:
    """Each node a horizontal bar from its first to its last token position; lines join a node to its parent."""
    at = {n.node_id: n for n in view.nodes}
    shown = [n for n in view.nodes if n.kind != "root"][:MAX_NODES]
    ex, ey = [], []
    for n in shown:
        p = at.get(n.parent_id)
        if p is not None:
            ex += [n.start, n.start, None]
            ey += [-p.y, -n.y, None]
    traces: list[go.BaseTraceType] = [go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#bbbbbb", width=1),
                                                 hoverinfo="skip", showlegend=False)]
    for kind, (name, color) in NODE_STYLE.items():
        nodes = [n for n in shown if n.kind == kind]
        xs, ys, hover = [], [], []
        for n in nodes:
            xs += [n.start, n.end, None]
            ys += [-n.y, -n.y, None]
            order = f", evicted #{n.evict_rank + 1}" if n.evict_rank is not None else ""
            h = (f"node {n.node_id}: {n.num_tokens} tokens at positions {n.start}..{n.end - 1}<br>"
                 f"blocks {list(n.block_ids)}<br>lock_ref {n.lock_ref}, last access {n.last_access}{order}<br>"
                 f"{n.label}")
            hover += [h, h, None]
        traces.append(go.Scatter(x=xs or [None], y=ys or [None], mode="lines+markers", name=name,
                                 line=dict(color=color, width=8), marker=dict(color=color, size=6),
                                 hovertext=hover or [None], hovertemplate="%{hovertext}<extra></extra>"))
        traces.append(go.Scatter(x=[n.start for n in nodes] or [None], y=[-n.y for n in nodes] or [None],
                                 mode="text", text=[n.label for n in nodes] or [""], textposition="top right",
                                 textfont=dict(size=MIN_FONT), hoverinfo="skip", showlegend=False))
    return traces


def prefix_tree_figure(trace: Sequence[StepTrace], step: int | None = None,
                       decode: Callable[[tuple[int, ...]], str] | None = None) -> go.Figure:
    """The radix tree after `step`: x = token position, one row per leaf; blue in use, orange evictable."""
    if not trace:
        return _named(placeholder("no engine steps yet: press Step"))
    cursor = clamp_step(trace, step)
    if not trace[cursor].prefix_tree:
        return _named(placeholder(f"step {cursor}: no radix prefix cache in this trace (prefix_cache='radix')"))
    view = prefix_tree_view(trace, cursor, decode)
    fig = go.Figure(prefix_tree_traces(view))
    n = len(view.nodes) - 1
    cut = f" (first {MAX_NODES} drawn)" if n > MAX_NODES else ""
    rate = (f", hits {view.prefix_hit_tokens}/{view.prefix_queried_tokens} prompt tokens this step"
            if view.prefix_queried_tokens else "")
    rows = 1 + max((x.y for x in view.nodes), default=0)
    fig.update_layout(
        meta=META, xaxis=dict(title="token position", rangemode="tozero"), yaxis=dict(visible=False),
        height=int(160 + 22 * min(rows, 30)), margin=dict(l=20, r=20, b=40),
        legend=dict(orientation="h", y=-0.2))
    fit_title(fig, f"Step {view.step}: radix prefix cache, {n} nodes{cut}, {view.num_cached_blocks} blocks cached "
                   f"({view.num_locked_blocks} in use, {view.num_evictable_blocks} evictable){rate}")
    return fig
