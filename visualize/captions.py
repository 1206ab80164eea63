"""A multi-line caption above a figure's plots (plotly titles clip multi-line text)."""
from __future__ import annotations

import plotly.graph_objects as go

from minillm.visualize.fit import BOOK_WIDTH, wrap

LINE_PX = 16
CAPTION_FONT = 12
CAPTION_PX = BOOK_WIDTH - 30  # a caption line's room: the column less the left margin and a little air


def caption_text(text: str) -> str:
    """The caption wrapped to the book's column (plotly would cut a long line at the figure's edge)."""
    return wrap(text, CAPTION_FONT, CAPTION_PX)


def caption_margin(text: str, extra: int = 30) -> int:
    """Top margin that fits the caption plus the subplot titles under it."""
    return extra + LINE_PX * (caption_text(text).count("<br>") + 1) + 10


def caption_annotation(text: str, extra: int = 30) -> go.layout.Annotation:
    return go.layout.Annotation(
        text=caption_text(text), name="caption", xref="paper", yref="paper", x=0, y=1, xanchor="left", yanchor="bottom",
        yshift=extra - 2, align="left", showarrow=False, font=dict(size=CAPTION_FONT),
    )


def set_caption(fig: go.Figure, text: str, extra: int = 30) -> None:
    """Replace the figure's caption annotation (keeps subplot titles and other annotations)."""
    kept = [a for a in fig.layout.annotations if a.name != "caption"]
    fig.layout.annotations = kept + [caption_annotation(text, extra)]
    fig.layout.margin.t = caption_margin(text, extra)


def si(value: float, unit: str) -> str:
    """1.23e9, "FLOP/s" -> "1.23 GFLOP/s"."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"
