"""A live plotly figure: a FigureWidget restyled in place from a figure builder.

Rebuilding the figure with the same builder the static views use and copying
its traces and layout into the widget keeps one rendering code path: what the
book shows is exactly what the live widget shows.
"""
from __future__ import annotations

from typing import Callable

import plotly.graph_objects as go


def placeholder(text: str, height: int = 260) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=14))
    fig.update_layout(height=height, xaxis=dict(visible=False), yaxis=dict(visible=False), plot_bgcolor="white")
    return fig


def sync_figure(widget: go.FigureWidget, fig: go.Figure, last: dict | None = None) -> dict:
    """Make `widget` show `fig`; returns fig's JSON to pass back as `last` next time.

    Only what differs from `last` is sent (plotly validates every property it
    sets, so resending unchanged traces and the layout template costs more than
    building the figure).
    """
    new = fig.to_plotly_json()
    new["layout"].pop("template", None)  # the same for every step
    old = last or {"data": [], "layout": {}}
    same_shape = (len(widget.data) == len(new["data"])
                  and all(a.type == b.get("type") for a, b in zip(widget.data, new["data"])))
    with widget.batch_update():
        if same_shape:
            for i, trace in enumerate(new["data"]):
                if i >= len(old["data"]) or old["data"][i] != trace:
                    widget.data[i].update(trace, overwrite=True)
        else:
            widget.data = ()
            widget.add_traces(list(fig.data))
        changed = {k: v for k, v in new["layout"].items() if old["layout"].get(k) != v}
        changed.update({k: None for k in old["layout"] if k not in new["layout"]})
        if changed:
            widget.layout.update(changed, overwrite=True)
    return new


class LiveFigure:
    """Holds a FigureWidget and redraws it from `builder(step)` when asked."""

    def __init__(self, builder: Callable[[int], go.Figure], empty_text: str = "no engine steps yet: press Step") -> None:
        self.builder = builder
        self.widget = go.FigureWidget(placeholder(empty_text))
        self.last_step: int | None = None
        self._last: dict | None = None

    def show(self, step: int) -> None:
        self._last = sync_figure(self.widget, self.builder(step), self._last)
        self.last_step = step
