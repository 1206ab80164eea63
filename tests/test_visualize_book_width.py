"""Static figures fit the book's column (issue 16): no title cut off, no text below MIN_FONT, cell labels in their cells.

The book draws a static figure at its column's width (~700-800 px); plotly cuts a title or caption
line at the figure's edge and lets a heatmap label overprint its neighbours. layout_problems()
estimates text widths from font sizes (no browser) at BOOK_WIDTH; every builder the notebooks call
for a static figure must come back clean, on small pools and on the demo's 728-block pool.
"""
from __future__ import annotations

import pytest

pytest.importorskip("plotly")

import plotly.graph_objects as go

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.visualize import Roofs
from minillm.visualize.block_plot import block_table_figure
from minillm.visualize.dashboard_plot import dashboard_figure
from minillm.visualize.fit import BOOK_WIDTH, MIN_FONT, fit_title, layout_problems, wrap
from minillm.visualize.lanes_plot import lanes_figure
from minillm.visualize.moe_plot import routing_figure
from minillm.visualize.prefix_tree_plot import prefix_tree_figure
from minillm.visualize.roofline_plot import roofline_figure
from minillm.visualize.spec_plot import spec_tree_figure
from minillm.visualize.timeline_plot import timeline_figure
from tests.helpers.engine_utils import greedy, make_engine, random_prompts, run_to_completion, tiny_model
from tests.test_visualize_lanes import run as run_lanes
from tests.test_visualize_moe import moe_trace  # noqa: F401  (a fixture)
from tests.test_visualize_spec import traced as spec_engine
from tests.test_visualize_views import record_trace

ROOFS = Roofs(bandwidth=20e9, peak_flops=1e12, label="test")


@pytest.fixture(scope="module")
def small():
    return record_trace()


@pytest.fixture(scope="module")
def demo_pool():
    """The demo's pool size (728 blocks): three-digit ids in the free queue and the block tables."""
    engine = make_engine(tiny_model(), num_blocks=728, block_size=4, max_num_seqs=8, max_num_batched_tokens=64)
    for i, prompt in enumerate(random_prompts(12, 97, 6, 40, seed=16)):
        engine.add_request(f"r{i}", prompt, greedy(8 + 2 * i))
    run_to_completion(engine)
    return engine.trace


def busiest(trace) -> int:
    return max(range(len(trace)), key=lambda i: sum(len(t) for _, t in trace[i].block_tables))


def test_block_and_dashboard_figures_fit(small, demo_pool):
    for trace in (small, demo_pool):
        for step in (0, busiest(trace), len(trace) - 1):
            for fig in (block_table_figure(trace, step), dashboard_figure(trace, ROOFS, step)):
                assert layout_problems(fig) == [], (fig.layout.meta, step)


def test_the_free_queue_keeps_three_digit_ids_legible(demo_pool):
    step = busiest(demo_pool)
    for fig in (block_table_figure(demo_pool, step), dashboard_figure(demo_pool, ROOFS, step)):
        queue = next(t for t in fig.data if t.name == "free queue")
        assert queue.textfont.size >= MIN_FONT
        # room for three-digit ids: fewer cells than the 32 a small pool gets, each id still drawn
        assert 8 <= len(queue.text[0]) < 32 and all(queue.text[0])


def test_other_static_figures_fit(small, moe_trace):  # noqa: F811
    lanes_engine, _ = run_lanes("length-aware")
    radix = LLMEngine(tiny_model(), None, [], EngineConfig(block_size=4, num_kv_blocks=12, max_num_seqs=2,
                                                           max_num_batched_tokens=32, prefix_cache="radix"))
    for i, p in enumerate(random_prompts(3, 97, 9, 14, seed=3)):
        radix.add_request(str(i), p, greedy(5))
    run_to_completion(radix)
    figs = {
        "timeline": timeline_figure(small, 5), "roofline": roofline_figure(small, ROOFS, 5),
        "lanes": lanes_figure(lanes_engine.trace, 3), "routing": routing_figure(moe_trace),
        "prefix tree": prefix_tree_figure(radix.trace, None, lambda ids: " ".join(f"tok{t}" for t in ids)),
        "spec": spec_tree_figure(spec_engine({"tree": [2, 2]}).trace, None),
    }
    for name, fig in figs.items():
        assert layout_problems(fig) == [], name


def test_the_check_catches_what_the_book_would_cut():
    fig = go.Figure(go.Heatmap(z=[[1, 2]], text=[["1000000000", "2"]], texttemplate="%{text}", textfont=dict(size=8)))
    fig.update_layout(width=BOOK_WIDTH + 100, title="a title " * 30)
    found = " | ".join(layout_problems(fig))
    assert "figure width" in found and "title" in found and "font 8" in found and "wider than" not in found
    fig.update_layout(width=None, xaxis_range=[-0.5, 40])  # 40 columns: ~15 px cells for a 10-digit id
    assert "wider than" in " | ".join(layout_problems(fig))
    fit_title(fig, "a title " * 30)
    assert not any("title" in p for p in layout_problems(fig))


def test_wrap_breaks_at_separators_and_keeps_short_lines():
    assert wrap("short", 12, 700) == "short"
    lines = wrap("a long clause, " * 20 + "end; " + "x" * 10, 12, 300).split("<br>")
    assert len(lines) > 1 and all(len(x) * 0.6 * 12 <= 300 for x in lines)
