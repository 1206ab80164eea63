"""Text that fits a static figure at the book's column width, and stays legible there.

The book shows a static figure at the width of its text column (about 700-800 px; plotly's
responsive config fills the container). Plotly never wraps a title or an annotation: a line
longer than the figure is cut at its edge. Heatmap cell text is not shrunk either: a label wider
than its cell overprints its neighbours. These helpers estimate text width from the font size
(no browser) so builders can wrap lines and drop labels that would not fit.
"""
from __future__ import annotations

import re

BOOK_WIDTH = 720  # px: the narrowest book column a static figure must fit
MIN_FONT = 10  # px: the smallest text a static figure draws
CHAR_EM = 0.6  # a glyph's average width / font size (plotly's Open Sans is ~0.55; rounded up to be safe)
TITLE_FONT = 17  # plotly's default title size
SUBPLOT_TITLE_FONT = 16  # make_subplots' default
LEGEND_SYMBOL_PX = 50  # a legend entry's symbol and padding, besides its text

_TAG = re.compile(r"<[^>]+>")


def lines(text: str) -> list[str]:
    """The visible lines of plotly text: split at <br>, tags dropped."""
    return [_TAG.sub("", part) for part in re.split(r"<br\s*/?>", str(text or ""))]


def text_px(text: str, size: float) -> float:
    """The estimated width of the widest line of `text` at font `size`."""
    return max(len(line) for line in lines(text)) * CHAR_EM * size


def wrap(text: str, size: float, width_px: float) -> str:
    """Break each line of `text` with <br> so none is wider than `width_px`; breaks at "; ", ", " or " "."""
    limit = max(1, int(width_px / (CHAR_EM * size)))
    out: list[str] = []
    for line in re.split(r"<br\s*/?>", text or ""):
        while len(_TAG.sub("", line)) > limit:
            # the strongest separator in the line's second half; else any space; else a hard cut
            at = [(i + len(sep)) for sep in ("; ", ", ", " ") if (i := line.rfind(sep, 0, limit)) > limit // 2]
            cut = at[0] if at else (line.rfind(" ", 0, limit) + 1 or limit)
            out.append(line[:cut].rstrip())
            line = line[cut:]
        out.append(line)
    return "<br>".join(out)


def legend_px(names: list[str], size: float = 12) -> float:
    """The width a vertical legend takes on the right of the plot."""
    return max((text_px(n, size) for n in names), default=0.0) + LEGEND_SYMBOL_PX


def legend_rows_px(names: list[str], size: float = 12, width: float = BOOK_WIDTH - 20) -> int:
    """The height of a horizontal legend `width` px wide: when its entries need more than one row,
    plotly lays them out in columns as wide as the widest entry."""
    if not names:
        return 0
    entry = max(text_px(n, size) for n in names) + 40  # symbol, gap, padding
    rows = 1 if sum(text_px(n, size) + 40 for n in names) <= width else -(-len(names) // max(1, int(width // entry)))
    return int(rows * (size + 10) + 10)


def fits(label: str, size: float, cell_px: float, pad_px: float = 4) -> bool:
    return text_px(label, size) + pad_px <= cell_px


def fit_title(fig, text: str, size: float = TITLE_FONT, width: float = BOOK_WIDTH) -> None:
    """Set `text` as the figure's title, wrapped to the column, with a top margin that holds its lines."""
    wrapped = wrap(text, size, width - 40)
    n = wrapped.count("<br>") + 1
    fig.update_layout(title=dict(text=wrapped, x=0.02, xanchor="left", yref="container", y=1, yanchor="top",
                                 pad=dict(t=10), font=dict(size=size)),
                      margin=dict(t=int(20 + n * size * 1.3)))


def _legend_width(fig) -> float:
    """The px a vertical legend takes on the right (0: hidden or horizontal)."""
    lg = fig.layout.legend
    names = [t.name for t in fig.data if t.name and t.showlegend is not False
             and (t.type != "heatmap" or t.showlegend)]  # a heatmap has no legend entry unless asked
    shown = fig.layout.showlegend if fig.layout.showlegend is not None else len(fig.data) > 1
    if not shown or not names or lg.orientation == "h" or (lg.x is not None and lg.x <= 1):
        return 0.0
    return legend_px(names, lg.font.size or 12)


def plot_width(fig, width: float = BOOK_WIDTH) -> float:
    """The px of the plotting area when the figure is `width` wide (margins and a right legend taken off)."""
    m = fig.layout.margin
    return (fig.layout.width or width) - (80 if m.l is None else m.l) - (80 if m.r is None else m.r) - _legend_width(fig)


def layout_problems(fig, width: float = BOOK_WIDTH) -> list[str]:
    """What would be cut off or illegible when `fig` is drawn `width` px wide; [] when nothing.

    Checks: the figure's own width; the title and every annotation (subplot titles, captions) within
    the figure and not overprinting another on the same line; fonts >= MIN_FONT; each heatmap's
    cell text within its cell.
    """
    out: list[str] = []
    w = fig.layout.width or width
    if w > width:
        out.append(f"figure width {w} > {width} px")
    left = 80 if fig.layout.margin.l is None else fig.layout.margin.l
    pw = plot_width(fig, width)
    title = fig.layout.title.text
    if title:
        size = fig.layout.title.font.size or TITLE_FONT
        if text_px(title, size) > w - 20:
            out.append(f"title {title!r} ~{text_px(title, size):.0f} px > {w - 20:.0f} px")
    spans: list[tuple[float, float, float, str]] = []
    for a in fig.layout.annotations:
        size = a.font.size or 12
        if size < MIN_FONT:
            out.append(f"annotation {a.text!r}: font {size} px < {MIN_FONT}")
        if a.xref != "paper" or not a.text:
            continue
        x = left + (0.5 if a.x is None else a.x) * pw
        tw = text_px(a.text, size)
        lo, hi = {"left": (x, x + tw), "right": (x - tw, x)}.get(a.xanchor, (x - tw / 2, x + tw / 2))
        if lo < 0 or hi > w:
            out.append(f"annotation {a.text!r} spans {lo:.0f}..{hi:.0f} px, outside 0..{w:.0f}")
        spans.append((round(a.y or 0.0, 3), a.yshift or 0, lo, hi, a.text))
    for i, (y, shift, lo, hi, text) in enumerate(spans):
        for y2, shift2, lo2, hi2, text2 in spans[i + 1:]:
            if (y, shift) == (y2, shift2) and lo < hi2 and lo2 < hi:
                out.append(f"annotations {text!r} and {text2!r} overprint each other")
    if fig.layout.legend.font.size is not None and fig.layout.legend.font.size < MIN_FONT:
        out.append(f"legend font {fig.layout.legend.font.size} px < {MIN_FONT}")
    for t in fig.data:
        size = getattr(getattr(t, "textfont", None), "size", None)
        if getattr(t, "text", None) is not None and size is not None and size < MIN_FONT:
            out.append(f"trace {t.name!r}: text font {size} px < {MIN_FONT}")
        if t.type == "heatmap" and t.text is not None and t.texttemplate:
            out += _heatmap_problems(fig, t, pw, size or 12)
    return out


def _heatmap_problems(fig, t, plot_px: float, size: float) -> list[str]:
    axis = fig.layout["xaxis" + (t.xaxis or "x")[1:]]
    domain = axis.domain or (0, 1)
    cols = (axis.range[1] - axis.range[0]) if axis.range else max((len(r) for r in t.text), default=1)
    cell = (domain[1] - domain[0]) * plot_px / max(cols, 1)
    wide = [str(s) for row in t.text for s in row if s not in (None, "") and not fits(str(s), size, cell)]
    return [f"heatmap {t.name!r}: {len(wide)} labels wider than a {cell:.0f} px cell, e.g. {wide[0]!r}"] if wide else []
