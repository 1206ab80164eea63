"""Predict-then-measure lines and knob sliders for the course notebooks.

A notebook about an engine knob (block size, seats, token budget, the draft length k)
lets the learner do two things with it:

1. predict a number, then measure it on the real engine::

       my_prediction = None  # type your number here
       measured = ...        # a count from the engine's trace: steps, slots, tokens per step
       print(prediction_line(my_prediction, measured, fmt=".0%"))

   `prediction_line` says "you predicted X, measured Y (off by Z)", or, while the
   prediction is still None, the measurement and what to type.

2. drag a slider over the knob's values. `KnobExplorer` reruns a small workload for
   each new value (`measure(**values)` returns a row: the numbers to show, and anything
   else the figure needs, e.g. the trace), keeps every row measured so far in a table
   and redraws an optional figure from the current row::

       explorer = KnobExplorer({"block_size": [8, 16, 32, 64]}, measure,
                               columns={"slots filled": ".0%", "steps": "d"},
                               figure=lambda row, rows: block_table_figure(row["trace"]))
       explorer                              # JupyterLab: the sliders, the table, the figure
       row = explorer.update(block_size=64)  # what dragging to 64 does, callable headless (nbval)

   Rows are cached per combination of values: the workloads are deterministic counts
   (greedy, `ignore_eos`), so a value measured once shows the same row when the slider
   comes back to it. `record(row, **values)` enters a row measured elsewhere in the
   notebook (the predict cell's run) without running it again.
"""
from __future__ import annotations

import html
import math
from numbers import Real
from typing import Any, Callable, Mapping, Sequence

from minillm.visualize.course import text_table

Row = dict[str, Any]


def _fmt(x: Any, fmt: str) -> str:
    if isinstance(x, Real) and not isinstance(x, bool):
        try:
            return format(x, fmt)
        except ValueError:  # e.g. "d" given a float
            return format(x, "+g" if fmt.startswith("+") else "g")
    return str(x)


def _signed(x: float, fmt: str) -> str:
    return _fmt(x, "+" + fmt) if not fmt.startswith(("+", "-", " ")) else _fmt(x, fmt)


def prediction_line(prediction: Real | None, measured: Real, *, fmt: str = "g",
                    name: str = "my_prediction", example: Real | None = None) -> str:
    """The line a predict-then-measure cell prints: the guess against the engine's number.

    `fmt` formats both numbers (".0%" for a fraction, "d" for a count, ".2f"). With a
    percent format a prediction above 1 is read as a percentage (70 -> 0.70), and the
    difference is given in percentage points. `example`, if given, shows in the hint
    printed while the prediction is None.
    """
    m = _fmt(measured, fmt)
    if prediction is None:
        hint = f"e.g. {name} = {example}" if example is not None else f"{name} = <your number>"
        return (f"measured: {m}. Predict before you look: type your number in the cell ({hint}) "
                f"and run it again.")
    if isinstance(prediction, bool) or not isinstance(prediction, Real) or not math.isfinite(prediction):
        raise TypeError(f"{name} should be a number (or None), got {prediction!r}")
    note = ""
    if fmt.endswith("%") and prediction > 1:
        prediction, note = prediction / 100, " (read as a percentage)"
    off = prediction - measured
    if math.isclose(off, 0.0, abs_tol=1e-12):
        verdict = "exactly right"
    else:
        if fmt.endswith("%"):  # fractions: the difference in percentage points
            by = format(off * 100, "+" + (fmt[:-1] or ".0") + "f") + " points"
        else:
            by = _signed(off, fmt) + (f", {abs(off) / abs(measured):.0%} of it" if measured else "")
        verdict = f"off by {by}: {'too high' if off > 0 else 'too low'}"
    return f"you predicted {_fmt(prediction, fmt)}{note}, measured {m} ({verdict})"


class KnobExplorer:
    """Sliders over engine knobs; each new setting reruns `measure` and shows its row.

    knobs:   knob name -> the values its slider offers, in order (one SelectionSlider each;
             the names are `measure`'s keyword arguments and the table's first columns)
    measure: measure(**values) -> a row (dict); the keys named in `columns` are shown
    columns: row key -> format spec (".0%", "d", ".2f", "" for str()); the table's other columns
    figure:  optional figure(row, rows) -> a plotly Figure, from the current row and every
             row measured so far (in knob order), drawn into a FigureWidget on each update
    value:   the sliders' starting values (default: each knob's first value); nothing is
             measured until `update` is called
    """

    def __init__(self, knobs: Mapping[str, Sequence[Any]], measure: Callable[..., Mapping[str, Any]], *,
                 columns: Mapping[str, str], figure: Callable[[Row, list[Row]], Any] | None = None,
                 value: Mapping[str, Any] | None = None, title: str = "") -> None:
        import ipywidgets as w

        if not knobs:
            raise ValueError("KnobExplorer needs at least one knob")
        self.knobs = {name: list(values) for name, values in knobs.items()}
        for name, values in self.knobs.items():
            if not values:
                raise ValueError(f"knob {name!r} offers no values")
        self.measure = measure
        self.columns = dict(columns)
        self.figure = figure
        self.title = title
        self.results: dict[tuple, Row] = {}
        self.current: tuple | None = None
        self.measured_count = 0  # measure() calls (cached rows do not count)
        start = dict(value or {})
        self.sliders = {
            name: w.SelectionSlider(options=[(str(v), v) for v in values], value=start.get(name, values[0]),
                                    description=name, continuous_update=False,
                                    style={"description_width": "initial"}, layout=w.Layout(width="460px"))
            for name, values in self.knobs.items()}
        self.status = w.Label("move a slider: the engine reruns the workload with that value")
        self.table = w.HTML()
        self.figure_widget = None
        self._last_fig: dict | None = None
        self._setting = False
        for s in self.sliders.values():
            s.observe(self._on_slide, names="value")
        self.widget = w.VBox([*self.sliders.values(), self.status, self.table])

    # ----- the verbs --------------------------------------------------------------------
    def key(self, **values: Any) -> tuple:
        """The full setting (missing knobs at their sliders' values) as a cache key, validated."""
        unknown = sorted(set(values) - set(self.knobs))
        if unknown:
            raise TypeError(f"unknown knob(s) {unknown}; this explorer has {list(self.knobs)}")
        key = []
        for name, allowed in self.knobs.items():
            v = values.get(name, self.sliders[name].value)
            if v not in allowed:
                raise ValueError(f"{name}={v!r} is not on the slider; choose one of {allowed}")
            key.append(v)
        return tuple(key)

    def record(self, row: Mapping[str, Any], **values: Any) -> Row:
        """Enter a row measured elsewhere (same workload, same measure) for this setting."""
        key = self.key(**values)
        self.results[key] = {**row, **dict(zip(self.knobs, key))}
        return self.results[key]

    def update(self, **values: Any) -> Row:
        """What moving the sliders to `values` does: measure (unless cached), then redraw. Returns the row."""
        key = self.key(**values)
        self._setting = True
        try:
            for name, v in zip(self.knobs, key):
                self.sliders[name].value = v
        finally:
            self._setting = False
        setting = ", ".join(f"{n}={v}" for n, v in zip(self.knobs, key))
        if key not in self.results:
            self.status.value = f"running the workload with {setting} ..."
            self.measured_count += 1
            self.record(self.measure(**dict(zip(self.knobs, key))), **dict(zip(self.knobs, key)))
        self.current = key
        self.status.value = f"showing {setting} ({len(self.results)} setting(s) measured so far)"
        self._redraw()
        return self.results[key]

    @property
    def row(self) -> Row | None:
        return None if self.current is None else self.results[self.current]

    @property
    def rows(self) -> list[Row]:
        """Every row measured so far, in the sliders' order of values."""
        order = [{v: i for i, v in enumerate(vals)} for vals in self.knobs.values()]
        return [self.results[k] for k in sorted(self.results, key=lambda k: [o[v] for o, v in zip(order, k)])]

    @property
    def text(self) -> str:
        """The table as plain text (what a notebook prints for the book); '*' marks the row shown."""
        return "\n".join(line.rstrip() for line in text_table(*self._cells()).splitlines())

    # ----- drawing ----------------------------------------------------------------------
    def _cells(self) -> tuple[list[str], list[list[str]]]:
        headers = [*self.knobs, *self.columns, "shown"]
        rows = []
        for r in self.rows:
            here = self.current is not None and self.results[self.current] is r
            rows.append([str(r[n]) for n in self.knobs]
                        + [_fmt(r[c], f) if c in r else "-" for c, f in self.columns.items()]
                        + ["*" if here else ""])
        return headers, rows

    def _html(self) -> str:
        headers, rows = self._cells()
        th = "".join(f"<th style='padding:2px 10px'>{html.escape(h)}</th>" for h in headers[:-1])
        body = []
        for r in rows:
            weight = "bold" if r[-1] else "normal"
            tds = "".join(f"<td style='padding:2px 10px;text-align:right'>{html.escape(c)}</td>" for c in r[:-1])
            body.append(f"<tr style='font-weight:{weight}'>{tds}</tr>")
        caption = f"<caption style='text-align:left'>{html.escape(self.title)}</caption>" if self.title else ""
        return f"<table style='font-family:monospace'>{caption}<tr>{th}</tr>{''.join(body)}</table>"

    def _redraw(self) -> None:
        self.table.value = self._html()
        if self.figure is None or self.current is None:
            return
        fig = self.figure(self.results[self.current], self.rows)
        from minillm.visualize.widgets import figure_widget, sync_figure

        if self.figure_widget is None:
            self.figure_widget = figure_widget(fig)
            self.widget.children = (*self.widget.children, self.figure_widget)
            self._last_fig = None
        self._last_fig = sync_figure(self.figure_widget, fig, self._last_fig)

    def _on_slide(self, change) -> None:
        if self._setting:
            return
        try:
            self.update(**{n: s.value for n, s in self.sliders.items()})
        except Exception as e:  # an observer's exception would vanish into the kernel log: show it
            self.status.value = f"failed: {type(e).__name__}: {e}"
            raise

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        # where widgets cannot run (the static book, a plain viewer): the table measured so far
        bundle["text/html"] = ("<p><em>Live knob explorer (" + ", ".join(html.escape(n) for n in self.knobs)
                               + "): run this notebook in JupyterLab and drag the sliders. Measured so far:</em></p>"
                               + self._html())
        bundle["text/plain"] = self.text
        return bundle
