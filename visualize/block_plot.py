"""Plotly rendering of the block table view: pool grid, free queue, per-sequence tables.

Each `*_traces` function returns a fixed number of traces for any step, so the
same functions feed a standalone figure, the live widget (restyled in place)
and the animated report (one frame per step).
"""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm.engine.trace import StepTrace
from minillm.visualize.block_view import BlockCell, BlockState, BlockTableView, block_table_view
from minillm.visualize.captions import set_caption
from minillm.visualize.palette import BLOCK_COLORS, BLOCK_NAMES, EVENT_COLORS, discrete_colorscale

LABEL_LIMIT = 256  # print ids inside cells only while they stay legible
OWNER_LIMIT = 128  # ... and the owning sequence's name below the id
QUEUE_SHOWN = 32  # free-queue entries drawn (the head: handed out first)
_SCALE = discrete_colorscale(BLOCK_COLORS)
_HEAT = dict(colorscale=_SCALE, zmin=0, zmax=len(BLOCK_COLORS) - 1, showscale=False, xgap=2, ygap=2)


def pool_columns(num_blocks: int) -> int:
    return 8 if num_blocks <= 32 else 16 if num_blocks <= 256 else 32


def _cell_hover(c: BlockCell, labels: dict[int, str]) -> str:
    lines = [f"block {c.block_id}: {BLOCK_NAMES[c.state]}", f"ref count {c.ref_count}"]
    for sid, logical in c.owners:
        lines.append(f"{labels.get(sid, f'seq {sid}')} logical block {logical}")
    if c.free_position is not None:
        lines.append(f"free queue position {c.free_position}" + (" (evicted when reached)" if c.cached else ""))
    ev = [name for name, on in (("allocated", c.allocated), ("freed", c.freed), ("evicted", c.evicted),
                                ("shared", c.shared)) if on]
    if ev:
        lines.append("this step: " + ", ".join(ev))
    return "<br>".join(lines)


def _cell_label(c: BlockCell, labels: dict[int, str], with_owner: bool) -> str:
    """Block id; ×ref count when shared; the owner's name when there is room."""
    if c.ref_count > 1:
        return f"{c.block_id}×{c.ref_count}"
    if with_owner and c.owners:
        sid = c.owners[0][0]
        return f"{c.block_id}<br>{labels.get(sid, f's{sid}')}"
    return str(c.block_id)


def pool_traces(view: BlockTableView) -> list[go.BaseTraceType]:
    """The physical pool as a grid (colour = state), plus one marker trace per block event."""
    cols = pool_columns(view.num_blocks)
    rows = -(-view.num_blocks // cols)
    labels = {t.seq_id: t.label for t in view.tables}
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    hover = [[""] * cols for _ in range(rows)]
    for c in view.cells:
        r, k = divmod(c.block_id, cols)
        z[r][k] = int(c.state)
        text[r][k] = _cell_label(c, labels, view.num_blocks <= OWNER_LIMIT) if view.num_blocks <= LABEL_LIMIT else ""
        hover[r][k] = _cell_hover(c, labels)
    traces: list[go.BaseTraceType] = [go.Heatmap(
        z=z, text=text, hovertext=hover, texttemplate="%{text}", textfont=dict(size=9),
        hovertemplate="%{hovertext}<extra></extra>", name="pool", **_HEAT,
    )]
    events = {"allocated": view.allocated, "freed": view.freed, "evicted": view.evicted, "shared": view.shared_events}
    symbols = {"allocated": "square-open", "freed": "circle-open", "evicted": "x-thin-open", "shared": "diamond-open"}
    for name, ids in events.items():
        ids = sorted(set(ids))
        # an empty trace drops out of the legend; a None point keeps the entry steady across steps
        xs, ys = ([b % cols for b in ids], [b // cols for b in ids]) if ids else ([None], [None])
        traces.append(go.Scatter(
            x=xs, y=ys, mode="markers", name=f"{name} this step",
            marker=dict(symbol=symbols[name], size=16, color=EVENT_COLORS[name], line=dict(width=3, color=EVENT_COLORS[name])),
            hovertemplate=f"block %{{customdata}} {name}<extra></extra>", customdata=ids, legendgroup="events",
        ))
    return traces


def queue_traces(view: BlockTableView, shown: int = QUEUE_SHOWN) -> list[go.BaseTraceType]:
    """The head of the free queue, left = handed out next; cached blocks there get evicted."""
    head = view.free_queue[:shown]
    cached = {c.block_id for c in view.cells if c.cached}
    z = [[int(BlockState.CACHED_FREE if b in cached else BlockState.FREE) for b in head] or [None]]
    text = [[str(b) for b in head] or [""]]
    hover = [[f"position {k}: block {b}" + (" (cached: evicted when handed out)" if b in cached else "")
              for k, b in enumerate(head)] or [""]]
    return [go.Heatmap(z=z, text=text, hovertext=hover, texttemplate="%{text}", textfont=dict(size=9),
                       hovertemplate="%{hovertext}<extra></extra>", name="free queue", **_HEAT)]


def table_traces(view: BlockTableView) -> list[go.BaseTraceType]:
    """Each running sequence's block table: row = sequence, column = logical block."""
    width = max((t.num_blocks for t in view.tables), default=0)
    z, text, hover = [], [], []
    for t in view.tables:
        pad = width - t.num_blocks
        z.append([int(BlockState.SHARED if s else BlockState.USED) for s in t.shared] + [None] * pad)
        text.append([str(b) for b in t.physical] + [""] * pad)
        hover.append([f"{t.label} logical {i} -> physical {b}" + (" (shared)" if s else "")
                      for i, (b, s) in enumerate(zip(t.physical, t.shared))] + [""] * pad)
    if not z:
        z, text, hover = [[None]], [[""]], [[""]]
    return [go.Heatmap(z=z, text=text, hovertext=hover, texttemplate="%{text}", textfont=dict(size=9),
                       hovertemplate="%{hovertext}<extra></extra>", name="block tables", **_HEAT)]


def legend_traces() -> list[go.BaseTraceType]:
    """Heatmaps have no legend: one invisible-data marker per state gives them one."""
    return [go.Scatter(x=[None], y=[None], mode="markers", name=name, legendgroup="states",
                       marker=dict(symbol="square", size=12, color=color))
            for name, color in zip(BLOCK_NAMES, BLOCK_COLORS)]


def pool_axes(view: BlockTableView) -> tuple[dict, dict]:
    rows = -(-view.num_blocks // pool_columns(view.num_blocks))
    x = dict(showgrid=False, zeroline=False, showticklabels=False)
    y = dict(showgrid=False, zeroline=False, showticklabels=False, range=[rows - 0.5, -0.5])
    return x, y


def queue_axes(view: BlockTableView) -> tuple[dict, dict]:
    x = dict(showgrid=False, zeroline=False, showticklabels=False, range=[-0.5, QUEUE_SHOWN - 0.5])
    y = dict(showgrid=False, zeroline=False, showticklabels=False)
    return x, y


def table_axes(view: BlockTableView) -> tuple[dict, dict]:
    n = max(1, len(view.tables))
    width = max((t.num_blocks for t in view.tables), default=1)
    x = dict(showgrid=False, zeroline=False, title_text="logical block", range=[-0.5, max(width, 4) - 0.5], dtick=1)
    y = dict(showgrid=False, zeroline=False, tickmode="array", tickvals=list(range(len(view.tables))),
             ticktext=[t.label for t in view.tables], range=[n - 0.5, -0.5], automargin=True)
    return x, y


def block_caption(view: BlockTableView) -> str:
    """One line on the step's pool: usage, events, prefix hits; preemption reasons on their own lines."""
    parts = [f"step {view.step}: {view.num_used}/{view.num_blocks} blocks used ({view.usage:.0%}), "
             f"{view.num_cached_free} free with cached content, {len(view.shared_blocks)} shared"]
    ev = [f"{len(ids)} {name}" for name, ids in (("allocated", view.allocated), ("freed", view.freed),
                                                  ("evicted", view.evicted), ("shared", view.shared_events)) if ids]
    if ev:
        parts.append("this step: " + ", ".join(ev))
    if view.prefix_queried_tokens:
        parts.append(f"prefix cache: {view.prefix_hit_tokens}/{view.prefix_queried_tokens} prompt tokens hit")
    for p in view.preemptions:
        parts.append(f"PREEMPTED {p.request_id} (seq {p.seq_id}): {p.reason}; "
                     f"{p.num_blocks_freed} blocks freed, {p.num_tokens_lost} tokens to recompute")
    return "<br>".join(parts)


def block_table_figure(trace: Sequence[StepTrace] | BlockTableView, step: int | None = None,
                       title: str | None = None) -> go.Figure:
    """The pool, its free queue and the block tables; pass draft_block_table_view(...) for a draft's pool."""
    view = trace if isinstance(trace, BlockTableView) else block_table_view(trace, step)
    pool_rows = -(-view.num_blocks // pool_columns(view.num_blocks))
    heights = [max(pool_rows, 2), 1, max(len(view.tables), 2)]
    fig = make_subplots(rows=3, cols=1, row_heights=heights, vertical_spacing=0.08,
                        subplot_titles=("physical KV block pool: id and owner (id×ref count when shared)",
                                        "free queue: handed out (and evicted) from the left",
                                        "block table per sequence: logical -> physical"))
    for tr in pool_traces(view) + legend_traces():
        fig.add_trace(tr, row=1, col=1)
    for tr in queue_traces(view):
        fig.add_trace(tr, row=2, col=1)
    for tr in table_traces(view):
        fig.add_trace(tr, row=3, col=1)
    for row, axes in ((1, pool_axes(view)), (2, queue_axes(view)), (3, table_axes(view))):
        fig.update_xaxes(axes[0], row=row, col=1)
        fig.update_yaxes(axes[1], row=row, col=1)
    total = sum(heights)
    fig.update_layout(
        height=int(300 + 24 * total), margin=dict(l=10, r=10, b=40), meta="minillm-block-table",
        legend=dict(x=1.02, y=1, yanchor="top"), plot_bgcolor="white",
    )
    set_caption(fig, block_caption(view))
    if title:
        fig.update_layout(title=title)
    return fig
