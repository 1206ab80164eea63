"""Views of the engine's step trace: view models, live widgets, static figures, the HTML report.

View models are pure functions of a list of StepTrace records and a step index
(no plotly, no engine), so they are unit-tested on recorded or synthetic traces:

    block_table_view(trace, step)   the paged KV pool and each sequence's block table
    draft_block_table_view(...)     a separate draft model's own pool (speculative decoding)
    timeline_view(trace, step)      sequences x steps, token counts against the budget
    roofline_view(trace, roofs, step)  each step under the machine's measured roofs
    spec_tree_view(trace, step)     a step's guesses per sequence as a tree, the accepted path
    prefix_tree_view(trace, step)   the radix prefix cache's tree: cached runs, locked vs evictable
    routing_view(trace, step)       a mixture of experts: tokens per expert per layer, load balance
    lanes_view(trace, step)         the scheduler's lanes: who waits in which lane, who runs; head_waits

Renderings (plotly; ipywidgets for the live ones) are imported on first use:

    block_table_figure, timeline_figure, roofline_figure, spec_tree_figure, dashboard_figure  static figures
    routing_figure                  tokens per expert per layer as a heatmap (static)
    prefix_tree_figure              the radix prefix cache's tree (static)
    lanes_figure                    the lanes at a step and per-lane counts per step (static)
    Dashboard(llm)                  live: all three views, Step / Run / slider
    write_html_report(trace, path)  a self-contained animated HTML report
    machine_roofs()                 this machine's measured roofs (cached)
"""
from __future__ import annotations

import importlib
from typing import Any

from minillm.visualize.block_view import BlockState, BlockTableView, block_table_view, draft_block_table_view
from minillm.visualize.lanes_view import HeadWait, LanesView, head_waits, lanes_view
from minillm.visualize.moe_view import RoutingView, routing_view
from minillm.visualize.prefix_tree_view import PrefixTreeView, prefix_tree_view
from minillm.visualize.roofline_view import Roofs, RooflineView, roofline_view
from minillm.visualize.spec_view import SpecTreeView, spec_tree_view
from minillm.visualize.timeline_view import SeqState, TimelineView, timeline_view

_LAZY = {
    "block_table_figure": "minillm.visualize.block_plot",
    "timeline_figure": "minillm.visualize.timeline_plot",
    "roofline_figure": "minillm.visualize.roofline_plot",
    "spec_tree_figure": "minillm.visualize.spec_plot",
    "prefix_tree_figure": "minillm.visualize.prefix_tree_plot",
    "lanes_figure": "minillm.visualize.lanes_plot",
    "routing_figure": "minillm.visualize.moe_plot",
    "dashboard_figure": "minillm.visualize.dashboard_plot",
    "Dashboard": "minillm.visualize.dashboard",
    "StepController": "minillm.visualize.controller",
    "write_html_report": "minillm.visualize.report",
    "machine_roofs": "minillm.visualize.roofs",
    "engine_roofs": "minillm.visualize.roofs",
    "show_figure": "minillm.visualize.show",
}

__all__ = ["BlockState", "BlockTableView", "HeadWait", "LanesView", "PrefixTreeView", "Roofs", "RooflineView",
           "RoutingView", "SeqState", "SpecTreeView", "TimelineView", "block_table_view", "draft_block_table_view",
           "head_waits", "lanes_view", "prefix_tree_view", "roofline_view", "routing_view", "spec_tree_view",
           "timeline_view", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'minillm.visualize' has no attribute {name!r}")
