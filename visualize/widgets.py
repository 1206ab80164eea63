"""A live plotly figure: a FigureWidget restyled in place from a figure builder.

Rebuilding the figure with the same builder the static views use and copying
its traces and layout into the widget keeps one rendering code path: what the
book shows is exactly what the live widget shows.

Two properties of plotly's FigureWidget (an anywidget) shape this file:

- its edits travel as one-off messages (restyle, addTraces), and a view draws
  from the synced state `_widget_data` / `_widget_layout`, which plotly only
  refreshes in the FigureWidget's own `_repr_mimebundle_`. A widget shown inside
  a container (our VBox) never gets that call, and messages sent before the
  browser has loaded the widget's code are dropped: the view then draws the
  state from the widget's creation (the "press Step" placeholder) or a
  half-applied mix of edits (a trace whose `marker` is undefined, which makes
  plotly.js throw "Cannot use 'in' operator to search for 'line' in undefined").
  So every sync also writes the full state (`push_state`).
- widget state is sent as strict JSON: a NaN (a masked heatmap cell) makes
  jupyter_client print "Out of range float values are not JSON compliant".
  Plotly's own JSON encoder writes NaN and inf as null, a gap; `json_safe` does
  the same before anything reaches a widget.
"""
from __future__ import annotations

import math
from copy import deepcopy
from typing import Any, Callable

import numpy as np
import plotly.graph_objects as go


def json_safe(obj: Any) -> Any:
    """`obj` with every NaN / inf float (Python or numpy, also inside arrays) replaced by None."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind == "f" and not np.isfinite(obj).all():
            return json_safe(obj.tolist())
        return obj
    if isinstance(obj, (float, np.floating)) and not math.isfinite(obj):
        return None
    return obj


def placeholder(text: str, height: int = 260) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=14))
    fig.update_layout(height=height, xaxis=dict(visible=False), yaxis=dict(visible=False), plot_bgcolor="white")
    return fig


def figure_widget(fig: go.Figure) -> go.FigureWidget:
    """A FigureWidget showing `fig`, with NaN / inf sent as gaps (null)."""
    return go.FigureWidget(json_safe(fig.to_plotly_json()))


def push_state(widget: go.FigureWidget) -> None:
    """Write the widget's whole figure into its synced state, which every new view draws from."""
    widget._widget_data = deepcopy(widget._data)
    widget._widget_layout = deepcopy(widget._layout_obj._props)


def sync_figure(widget: go.FigureWidget, fig: go.Figure, last: dict | None = None) -> dict:
    """Make `widget` show `fig`; returns fig's JSON to pass back as `last` next time.

    Only what differs from `last` is sent as edits (plotly validates every
    property it sets, so resending unchanged traces and the layout template
    costs more than building the figure); the full state follows (see above).
    """
    new = json_safe(fig.to_plotly_json())
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
            widget.add_traces(new["data"])
        changed = {k: v for k, v in new["layout"].items() if old["layout"].get(k) != v}
        changed.update({k: None for k in old["layout"] if k not in new["layout"]})
        if changed:
            widget.layout.update(changed, overwrite=True)
    push_state(widget)
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
