"""A self-contained HTML report: the dashboard animated over the recorded steps.

One plotly figure with a frame per step and a slider; plotly.js is embedded
inline (once) so the file opens offline. `minillm demo --html report.html` calls
`write_html_report(llm.trace, path)`.

Size: plotly.js is ~4.8 MB; the figure is kept small next to it. A frame
carries only the traces that move with the cursor (pool, free queue, block
tables, cursor ring) and, of those, only the attributes that differ between
steps: what every frame shares stays once in the figure (subtitles, colours,
the block ids). The pool's hover, a sentence per fact for every block (85% of
a frame before), is worded once by a hovertemplate (`POOL_HOVER`) over short
per-block fields (`pool_hover_data`). Floats keep 6 significant digits and
whole floats are written as integers.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import plotly.graph_objects as go

from minillm.engine.trace import StepTrace
from minillm.visualize import block_plot as bf
from minillm.visualize.block_view import BlockTableView, block_table_view
from minillm.visualize.dashboard_plot import build_dashboard, dashboard_frame
from minillm.visualize.palette import BLOCK_NAMES
from minillm.visualize.roofline_view import Roofs

MAX_FRAMES = 150  # a frame costs ~28 bytes per pool block: ~20 kB for the demo's 728 blocks (70 kB before issue 16)
FLOAT_DIGITS = 6  # significant digits kept in the report's data: renders pixel-identical to full precision

# The pool cell's hover: the facts block_plot's hover text lists, worded once for the whole report.
# hovertext: the block id (the same in every frame, so it stays in the figure);
# customdata: [state, ref count, "<br>"-led owner and this-step lines, free-queue position or "none"]
POOL_HOVER = ("block %{hovertext}: %{customdata[0]}<br>ref count %{customdata[1]}%{customdata[2]}"
              "<br>free queue position %{customdata[3]}<extra></extra>")


def frame_steps(num_steps: int, max_frames: int = MAX_FRAMES) -> list[int]:
    """Every step, or evenly spaced steps (always the first and the last) for long traces."""
    if num_steps <= max_frames:
        return list(range(num_steps))
    stride = (num_steps - 1) / (max_frames - 1)
    return sorted({round(k * stride) for k in range(max_frames)})


def pool_hover_data(view: BlockTableView) -> tuple[list[list[int | None]], list[list[list | None]]]:
    """The pool grid's hovertext (block ids) and customdata for POOL_HOVER; None on the padding cells."""
    cols = bf.pool_columns(view.num_blocks)
    rows = -(-view.num_blocks // cols)
    labels = {t.seq_id: t.label for t in view.tables}
    ids: list[list[int | None]] = [[None] * cols for _ in range(rows)]
    facts: list[list[list | None]] = [[None] * cols for _ in range(rows)]
    for c in view.cells:
        lines = "".join(f"<br>{labels.get(sid, f'seq {sid}')} logical block {logical}" for sid, logical in c.owners)
        ev = [name for name, on in (("allocated", c.allocated), ("freed", c.freed), ("evicted", c.evicted),
                                    ("shared", c.shared)) if on]
        if ev:
            lines += "<br>this step: " + ", ".join(ev)
        position: int | str = "none" if c.free_position is None else c.free_position
        if c.free_position is not None and c.cached:
            position = f"{c.free_position} (evicted when reached)"
        r, k = divmod(c.block_id, cols)
        ids[r][k] = c.block_id
        facts[r][k] = [BLOCK_NAMES[c.state], c.ref_count, lines, position]
    return ids, facts


def _compact_pool(heatmap: dict, view: BlockTableView) -> None:
    ids, facts = pool_hover_data(view)
    heatmap.update(hovertext=ids, customdata=facts, hovertemplate=POOL_HOVER, hoverongaps=False)


def _round(value: Any) -> Any:
    """Floats to FLOAT_DIGITS significant digits, whole ones as ints; strings and the rest untouched."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return value
        value = float(f"{value:.{FLOAT_DIGITS}g}")
        return int(value) if value.is_integer() else value
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value


def _implied(value: Any, base: Any) -> bool:
    """Does merging `value` into `base` change nothing? (frames merge objects into the figure, arrays replace)"""
    if isinstance(value, dict):
        return isinstance(base, dict) and all(_implied(v, base.get(k)) for k, v in value.items())
    return value == base


# layout arrays plotly.js merges item by item into the figure's when it animates to a frame
ARRAY_CONTAINERS = ("annotations", "shapes")


def _prune(values: list[dict], base: Any, keep: tuple[str, ...] = ()) -> None:
    """Remove from each frame's dict in `values` what no frame changes: it is in `base`, the figure, already.

    Frames merge objects into the figure (arrays replace), so a key may go when every frame's value
    is implied by the figure's; a subtitle or a line's colour need not travel with every step."""
    b = base if isinstance(base, dict) else {}
    for k in sorted({k for v in values for k in v} - set(keep)):
        present = [v[k] for v in values if k in v]
        if all(_implied(x, b.get(k)) for x in present):
            for v in values:
                v.pop(k, None)
        elif isinstance(b.get(k), dict) and all(isinstance(x, dict) for x in present):
            _prune(present, b[k])
        elif (k in ARRAY_CONTAINERS and isinstance(b.get(k), list)
              and all(isinstance(x, list) and len(x) == len(b[k]) for x in present)
              and all(isinstance(item, dict) for x in present for item in x)):
            for i, item in enumerate(b[k]):
                _prune([x[i] for x in present], item)


def _drop_unchanged(data: list[dict], layout: dict, frames: list[dict]) -> None:
    for slot, idx in enumerate(frames[0]["traces"]):
        _prune([f["data"][slot] for f in frames], data[idx], keep=("type",))  # a frame's trace needs its type
    _prune([f["layout"] for f in frames if "layout" in f], layout)


def report_figure(trace: Sequence[StepTrace], roofs: Roofs, max_frames: int = MAX_FRAMES) -> go.Figure:
    steps = frame_steps(len(trace), max_frames)
    fig, dash = build_dashboard(trace, roofs, steps[0])
    titles = [a for a in fig.layout.annotations if a.name != "caption"]
    frames = [dashboard_frame(trace, roofs, s, dash, titles).to_plotly_json() for s in steps]
    data = [tr.to_plotly_json() for tr in fig.data]
    layout = fig.layout.to_plotly_json()
    heat = dash.pool[0]
    _compact_pool(data[heat], block_table_view(trace, steps[0]))
    for f, s in zip(frames, steps):
        slot = f["traces"].index(heat)
        _compact_pool(f["data"][slot], block_table_view(trace, s))
        f["data"] = [_round(d) for d in f["data"]]
    data = [_round(d) for d in data]
    _drop_unchanged(data, layout, frames)
    fig = go.Figure(data=data, layout=layout, frames=frames)
    anim = dict(mode="immediate", frame=dict(duration=0, redraw=True), transition=dict(duration=0))
    fig.update_layout(
        sliders=[dict(
            active=0, currentvalue=dict(prefix="step "), pad=dict(t=50), x=0.12, len=0.86,
            steps=[dict(label=str(s), method="animate", args=[[str(s)], anim]) for s in steps],
        )],
        updatemenus=[dict(
            type="buttons", direction="left", x=0, y=0, xanchor="left", yanchor="top", pad=dict(t=75),
            buttons=[
                dict(label="Play", method="animate",
                     args=[None, dict(mode="immediate", fromcurrent=True, frame=dict(duration=300, redraw=True),
                                      transition=dict(duration=0))]),
                dict(label="Pause", method="animate", args=[[None], anim]),
            ],
        )],
    )
    fig.update_layout(height=fig.layout.height + 120, margin_b=140)
    return fig


def write_html_report(trace: Sequence[StepTrace], path: str | Path, roofs: Roofs | None = None,
                      device: str | None = None, dtype: str = "float32", max_frames: int = MAX_FRAMES,
                      title: str = "minillm step trace") -> Path:
    """Write the animated dashboard of `trace` to `path`.

    The roofline's roofs default to this machine's (measured once, cached) for `device`
    (default: CUDA when available, as LLM() does, else the CPU) and the weights' `dtype`.
    """
    if not trace:
        raise ValueError("the trace is empty: run the engine for at least one step")
    if roofs is None:
        import torch

        from minillm.visualize.roofs import machine_roofs

        roofs = machine_roofs(device or ("cuda" if torch.cuda.is_available() else "cpu"), dtype)
    fig = report_figure(list(trace), roofs, max_frames)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    html = fig.to_html(include_plotlyjs=True, full_html=True, auto_play=False, div_id="minillm-report")
    html = html.replace("<head>", f"<head><title>{title}</title>", 1)
    path.write_text(html, encoding="utf-8")
    return path
