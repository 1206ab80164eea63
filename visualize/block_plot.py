"""Plotly rendering of the block table view: pool grid, free queue, per-sequence tables.

Each `*_traces` function returns a fixed number of traces for any step, so the
same functions feed a standalone figure, the live widget (restyled in place)
and the animated report (one frame per step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm.engine.trace import StepTrace
from minillm.visualize.block_view import BlockCell, BlockState, BlockTableView, block_table_view
from minillm.visualize.captions import set_caption
from minillm.visualize.fit import BOOK_WIDTH, MIN_FONT, fits, legend_px, text_px
from minillm.visualize.palette import BLOCK_COLORS, BLOCK_NAMES, EVENT_COLORS, discrete_colorscale

OWNER_LIMIT = 128  # the owning sequence's name below the id only in pools this small (and when it fits)
QUEUE_SHOWN = 32  # free-queue entries drawn at most (the head: handed out first); fewer when their ids would not fit
EVENT_NAMES = ("allocated", "freed", "evicted", "shared")
_SCALE = discrete_colorscale(BLOCK_COLORS)
_HEAT = dict(colorscale=_SCALE, zmin=0, zmax=len(BLOCK_COLORS) - 1, showscale=False, xgap=2, ygap=2)
_FONT = dict(size=MIN_FONT)


def pool_columns(num_blocks: int) -> int:
    return 8 if num_blocks <= 32 else 16 if num_blocks <= 256 else 32


def legend_names() -> list[str]:
    return [f"{name} this step" for name in EVENT_NAMES] + list(BLOCK_NAMES)


@dataclass(frozen=True)
class PoolFit:
    """How the pool, queue and table panels draw in `panel_px` of width: cells that keep their ids legible."""

    num_blocks: int
    panel_px: float

    @property
    def columns(self) -> int:
        return pool_columns(self.num_blocks)

    @property
    def cell_px(self) -> float:
        return self.panel_px / self.columns

    @property
    def widest_id(self) -> str:
        """The widest block id, as text: what every cell must fit for ids to be drawn at all."""
        return str(max(self.num_blocks - 1, 0))

    @property
    def pool_ids(self) -> bool:
        return fits(self.widest_id, MIN_FONT, self.cell_px)

    @property
    def queue_shown(self) -> int:
        """Free-queue cells drawn: as many as fit with the widest id legible, at most QUEUE_SHOWN."""
        need = text_px(self.widest_id, MIN_FONT) + 6  # the text, its padding, the cell gap
        return max(1, min(QUEUE_SHOWN, int(self.panel_px // need)))

    def table_ids(self, num_logical: int) -> bool:
        return fits(self.widest_id, MIN_FONT, self.panel_px / max(num_logical, 4))


def block_fit(num_blocks: int, panel_px: float | None = None) -> PoolFit:
    """The standalone figure's panels: the book's width less margins and the legend."""
    return PoolFit(num_blocks, BOOK_WIDTH - 20 - legend_px(legend_names()) if panel_px is None else panel_px)


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


def _cell_label(c: BlockCell, labels: dict[int, str], fit: PoolFit) -> str:
    """Block id; ×ref count when shared; the owner's name in small pools; each only when it fits the cell."""
    if not fit.pool_ids:
        return ""
    if c.ref_count > 1:
        shared = f"{c.block_id}×{c.ref_count}"
        return shared if fits(shared, MIN_FONT, fit.cell_px) else str(c.block_id)
    if fit.num_blocks <= OWNER_LIMIT and c.owners:
        sid = c.owners[0][0]
        owner = labels.get(sid, f"s{sid}")
        if fits(owner, MIN_FONT, fit.cell_px):
            return f"{c.block_id}<br>{owner}"
    return str(c.block_id)


def pool_traces(view: BlockTableView, fit: PoolFit | None = None) -> list[go.BaseTraceType]:
    """The physical pool as a grid (colour = state), plus one marker trace per block event."""
    fit = fit or block_fit(view.num_blocks)
    cols = fit.columns
    rows = -(-view.num_blocks // cols)
    labels = {t.seq_id: t.label for t in view.tables}
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    hover = [[""] * cols for _ in range(rows)]
    for c in view.cells:
        r, k = divmod(c.block_id, cols)
        z[r][k] = int(c.state)
        text[r][k] = _cell_label(c, labels, fit)
        hover[r][k] = _cell_hover(c, labels)
    traces: list[go.BaseTraceType] = [go.Heatmap(
        z=z, text=text, hovertext=hover, texttemplate="%{text}", textfont=_FONT,
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


def queue_traces(view: BlockTableView, fit: PoolFit | None = None) -> list[go.BaseTraceType]:
    """The head of the free queue, left = handed out next; cached blocks there get evicted."""
    head = view.free_queue[:(fit or block_fit(view.num_blocks)).queue_shown]
    cached = {c.block_id for c in view.cells if c.cached}
    z = [[int(BlockState.CACHED_FREE if b in cached else BlockState.FREE) for b in head] or [None]]
    text = [[str(b) for b in head] or [""]]
    hover = [[f"position {k}: block {b}" + (" (cached: evicted when handed out)" if b in cached else "")
              for k, b in enumerate(head)] or [""]]
    return [go.Heatmap(z=z, text=text, hovertext=hover, texttemplate="%{text}", textfont=_FONT,
                       hovertemplate="%{hovertext}<extra></extra>", name="free queue", **_HEAT)]


def table_traces(view: BlockTableView, fit: PoolFit | None = None) -> list[go.BaseTraceType]:
    """Each running sequence's block table: row = sequence, column = logical block (ids while they fit)."""
    width = max((t.num_blocks for t in view.tables), default=0)
    ids = (fit or block_fit(view.num_blocks)).table_ids(width)
    z, text, hover = [], [], []
    for t in view.tables:
        pad = width - t.num_blocks
        z.append([int(BlockState.SHARED if s else BlockState.USED) for s in t.shared] + [None] * pad)
        text.append([str(b) if ids else "" for b in t.physical] + [""] * pad)
        hover.append([f"{t.label} logical {i} -> physical {b}" + (" (shared)" if s else "")
                      for i, (b, s) in enumerate(zip(t.physical, t.shared))] + [""] * pad)
    if not z:
        z, text, hover = [[None]], [[""]], [[""]]
    return [go.Heatmap(z=z, text=text, hovertext=hover, texttemplate="%{text}", textfont=_FONT,
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


def queue_axes(view: BlockTableView, fit: PoolFit | None = None) -> tuple[dict, dict]:
    shown = (fit or block_fit(view.num_blocks)).queue_shown
    x = dict(showgrid=False, zeroline=False, showticklabels=False, range=[-0.5, shown - 0.5])
    y = dict(showgrid=False, zeroline=False, showticklabels=False)
    return x, y


def table_axes(view: BlockTableView, fit: PoolFit | None = None) -> tuple[dict, dict]:
    n = max(1, len(view.tables))
    width = max(max((t.num_blocks for t in view.tables), default=1), 4)
    # a tick per logical block while the numbers (12 px font) fit side by side; else every 5th
    step = 1 if (fit or block_fit(view.num_blocks)).panel_px / width >= text_px(str(width), 12) + 6 else 5
    x = dict(showgrid=False, zeroline=False, title_text="logical block", range=[-0.5, width - 0.5], dtick=step)
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
    fit = block_fit(view.num_blocks)
    pool_rows = -(-view.num_blocks // fit.columns)
    heights = [max(pool_rows, 2), 1, max(len(view.tables), 2)]
    fig = make_subplots(rows=3, cols=1, row_heights=heights, vertical_spacing=0.08,
                        subplot_titles=("physical KV block pool: id, owner (id×refs if shared)",
                                        "free queue: handed out (and evicted) from the left",
                                        "block table per sequence: logical -> physical"))
    for tr in pool_traces(view, fit) + legend_traces():
        fig.add_trace(tr, row=1, col=1)
    for tr in queue_traces(view, fit):
        fig.add_trace(tr, row=2, col=1)
    for tr in table_traces(view, fit):
        fig.add_trace(tr, row=3, col=1)
    for row, axes in ((1, pool_axes(view)), (2, queue_axes(view, fit)), (3, table_axes(view, fit))):
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
