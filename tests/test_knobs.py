"""visualize/knobs.py: the predict-then-measure line and the knob slider, driven from Python."""
from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")  # plotly's FigureWidget is an anywidget

import plotly.graph_objects as go

from minillm.visualize.knobs import KnobExplorer, prediction_line
from tests.helpers.engine_utils import greedy, make_engine, run_to_completion, tiny_model


def test_prediction_line_without_a_prediction_says_what_to_type():
    line = prediction_line(None, 12, fmt="d", example=20)
    assert "measured: 12" in line and "my_prediction = 20" in line and "predicted" not in line


def test_prediction_line_compares_counts_and_fractions():
    assert prediction_line(15, 12, fmt="d") == "you predicted 15, measured 12 (off by +3, 25% of it: too high)"
    assert prediction_line(12, 12, fmt="d") == "you predicted 12, measured 12 (exactly right)"
    assert "off by -0.5" in prediction_line(3.5, 4.0, fmt="g") and "too low" in prediction_line(3.5, 4.0)
    assert prediction_line(0.5, 0.75, fmt=".0%") == "you predicted 50%, measured 75% (off by -25 points: too low)"
    pct = prediction_line(70, 0.75, fmt=".0%")  # 70 typed for 70%
    assert pct == "you predicted 70% (read as a percentage), measured 75% (off by -5 points: too low)"
    assert "off by +2.5" in prediction_line(12.5, 10, fmt="d")  # a float guess of a count still prints
    with pytest.raises(TypeError, match="my_prediction should be a number"):
        prediction_line("12", 12)


def fake_explorer(**kw):
    calls = []

    def measure(a, b):
        calls.append((a, b))
        return {"sum": a + b, "ratio": a / b, "hidden": object()}

    ex = KnobExplorer({"a": [1, 2, 3], "b": [10, 20]}, measure, columns={"sum": "d", "ratio": ".2f"}, **kw)
    return ex, calls


def test_update_measures_once_per_setting_and_moves_the_sliders():
    ex, calls = fake_explorer(value={"a": 2})
    assert ex.row is None and ex.sliders["a"].value == 2 and ex.sliders["b"].value == 10
    row = ex.update(a=3)  # b stays at its slider's value
    assert row["sum"] == 13 and calls == [(3, 10)] and ex.sliders["a"].value == 3
    ex.update(b=20)
    ex.update(a=3, b=10)  # measured before: the cached row, no new run
    assert calls == [(3, 10), (3, 20)] and ex.measured_count == 2 and ex.current == (3, 10)
    lines = ex.text.splitlines()
    assert lines[0].split() == ["a", "b", "sum", "ratio", "shown"] and len(lines) == 4
    assert lines[2].split() == ["3", "10", "13", "0.30", "*"] and lines[3].split() == ["3", "20", "23", "0.15"]
    assert "font-weight:bold" in ex.table.value and "23" in ex.table.value
    with pytest.raises(ValueError, match="not on the slider"):
        ex.update(a=4)
    with pytest.raises(TypeError, match="unknown knob"):
        ex.update(c=1)


def test_dragging_a_slider_reruns_and_record_seeds_the_cache():
    ex, calls = fake_explorer()
    ex.record({"sum": 99, "ratio": 0.5}, a=2, b=20)  # measured elsewhere: not run again
    ex.sliders["b"].value = 20  # what a drag in the page does
    assert calls == [(1, 20)] and ex.row["sum"] == 21
    ex.sliders["a"].value = 2
    assert calls == [(1, 20)] and ex.row["sum"] == 99
    assert [r["a"] for r in ex.rows] == [1, 2]  # in the slider's order
    bundle = ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "99" in bundle["text/html"]


def test_the_figure_is_drawn_from_the_current_row_and_all_rows():
    seen = []

    def figure(row, rows):
        seen.append((row["a"], len(rows)))
        return go.Figure(go.Scatter(x=[r["a"] for r in rows], y=[r["sum"] for r in rows]))

    ex, _ = fake_explorer(figure=figure)
    assert ex.figure_widget is None
    ex.update(a=1)
    ex.update(a=3)
    assert seen == [(1, 1), (3, 2)] and ex.figure_widget in ex.widget.children
    assert list(ex.figure_widget.data[0].x) == [1, 3] and list(ex.figure_widget.data[0].y) == [11, 13]


def test_a_real_engine_behind_the_seats_slider():
    """More seats, fewer steps: the tiny engine's trace, through the explorer."""
    model = tiny_model()
    prompts = [[3 + i] * (5 + i) for i in range(6)]

    def measure(max_num_seqs):
        engine = make_engine(model, num_blocks=64, block_size=4, max_num_seqs=max_num_seqs)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, greedy(6))
        run_to_completion(engine)
        return {"steps": len(engine.trace), "max seqs/step": max(len(s.scheduled) for s in engine.trace)}

    ex = KnobExplorer({"max_num_seqs": [1, 2, 6]}, measure, columns={"steps": "d", "max seqs/step": "d"})
    one, six = ex.update(max_num_seqs=1), ex.update(max_num_seqs=6)
    assert one["steps"] == 6 * 6 and one["max seqs/step"] == 1  # one at a time: a prefill step and 5 decodes each
    assert six["steps"] == 6 and six["max seqs/step"] == 6
