"""Show a static plotly figure so it renders both in JupyterLab and in the built book.

JupyterLab draws the plotly MIME type with its plotly extension. The book
(Sphinx) falls back to the text/html part: a div plus a script that expects
plotly.js to be loaded already, which the book does once per page from its
own _static folder -- so pages stay small and work offline.
"""
from __future__ import annotations

import json

import plotly.graph_objects as go
from plotly.io import to_html
from plotly.utils import PlotlyJSONEncoder


def figure_bundle(fig: go.Figure) -> dict[str, object]:
    spec = json.loads(json.dumps(fig.to_plotly_json(), cls=PlotlyJSONEncoder))
    html = to_html(fig, include_plotlyjs=False, full_html=False, config={"responsive": True})
    title = fig.layout.meta if isinstance(fig.layout.meta, str) else "figure"
    return {
        "application/vnd.plotly.v1+json": {"data": spec["data"], "layout": spec["layout"], "config": {}},
        "text/html": html,
        "text/plain": f"<{title}: plotly figure, {len(fig.data)} traces>",
    }


def show_figure(fig: go.Figure) -> None:
    """Display `fig` as a static figure (use a Dashboard for the live one)."""
    from IPython.display import display

    display(figure_bundle(fig), raw=True)
