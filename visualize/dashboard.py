"""The live dashboard: block table, batch timeline, roofline (speculation, radix tree, MoE routing, lanes) sharing one step cursor.

    dash = Dashboard(llm)            # or an LLMEngine; requests already added or added later
    dash                             # shows the views and Step / Run / slider
    dash.step(5)                     # what the Step button does, from code
    await dash.run()                 # what Run does: until the engine is out of work

`Dashboard.from_trace(trace, roofs)` scrubs a recorded trace without an engine.
"""
from __future__ import annotations

import ipywidgets as w

from minillm.visualize.block_plot import block_table_figure
from minillm.visualize.controller import StepController
from minillm.visualize.lanes_plot import lanes_figure
from minillm.visualize.moe_plot import routing_figure
from minillm.visualize.prefix_tree_plot import prefix_tree_figure
from minillm.visualize.roofline_plot import roofline_figure
from minillm.visualize.roofline_view import Roofs
from minillm.visualize.spec_plot import spec_tree_figure
from minillm.visualize.timeline_plot import timeline_figure
from minillm.visualize.widgets import LiveFigure


class Dashboard:
    def __init__(self, engine=None, roofs: Roofs | None = None, trace: list | None = None,
                 interval_s: float = 0.05) -> None:
        self.controller = StepController(engine, trace, interval_s)
        if roofs is None and self.controller.engine is not None:
            from minillm.visualize.roofs import engine_roofs

            roofs = engine_roofs(self.controller.engine)
        self.roofs = roofs
        # the builders read the trace when called: the engine appends to it as it steps
        self.block_table = LiveFigure(lambda s: block_table_figure(self.trace, s))
        self.timeline = LiveFigure(lambda s: timeline_figure(self.trace, s))
        self.roofline = LiveFigure(lambda s: roofline_figure(self.trace, self.roofs, s)) if roofs is not None else None
        # speculative decoding: each step's guesses as a tree and what the target kept
        self.spec = None
        engine = self.controller.engine
        if (engine is not None and engine.config.speculative is not None) or any(r.spec for r in self.trace):
            tok = getattr(engine, "tokenizer", None)
            decode = (lambda t: tok.decode([t])) if tok is not None else None
            self.spec = LiveFigure(lambda s: spec_tree_figure(self.trace, s, decode))
        # the radix prefix cache: its tree of cached blocks, locked vs evictable
        self.prefix_tree = None
        if (engine is not None and engine.config.enable_prefix_caching and engine.config.prefix_cache == "radix") \
                or any(r.prefix_tree for r in self.trace):
            tok = getattr(engine, "tokenizer", None)
            ids_text = (lambda ids: repr(tok.decode(list(ids)))) if tok is not None else None
            self.prefix_tree = LiveFigure(lambda s: prefix_tree_figure(self.trace, s, ids_text))
        # a mixture-of-experts model: tokens per expert per layer, summed over the steps up to the cursor
        self.routing = None
        is_moe = bool(getattr(getattr(engine, "model_config", None), "is_moe", False))
        if is_moe or any(r.moe_layers for r in self.trace):
            self.routing = LiveFigure(lambda s: routing_figure(self.trace, s))
        # a scheduling policy with lanes (priority, length-aware): who waits in which lane, who runs
        self.lanes = None
        policy = getattr(getattr(engine, "config", None), "scheduling_policy", "fcfs")
        if policy != "fcfs" or any(r.scheduling_policy != "fcfs" for r in self.trace):
            self.lanes = LiveFigure(lambda s: lanes_figure(self.trace, s))
        self.controller.observe(self._show)
        views = [self.block_table.widget] + ([self.roofline.widget] if self.roofline else [])
        self.widget = w.VBox([
            self.controller.widget,
            w.HBox(views, layout=w.Layout(flex_flow="row wrap")),
            self.timeline.widget,
            *([self.spec.widget] if self.spec else []),
            *([self.prefix_tree.widget] if self.prefix_tree else []),
            *([self.routing.widget] if self.routing else []),
            *([self.lanes.widget] if self.lanes else []),
        ])
        if self.controller.trace:
            self.controller.show(len(self.controller.trace) - 1)

    @property
    def trace(self) -> list:
        return self.controller.trace

    @classmethod
    def from_trace(cls, trace: list, roofs: Roofs | None = None) -> "Dashboard":
        return cls(None, roofs, trace)

    def _show(self, step: int) -> None:
        self.block_table.show(step)
        self.timeline.show(step)
        if self.roofline is not None:
            self.roofline.show(step)
        if self.spec is not None:
            self.spec.show(step)
        if self.prefix_tree is not None:
            self.prefix_tree.show(step)
        if self.routing is not None:
            self.routing.show(step)
        if self.lanes is not None:
            self.lanes.show(step)

    # the controller's verbs, for code cells
    def step(self, n: int = 1) -> int:
        return self.controller.step(n)

    async def run(self, max_steps: int | None = None) -> int:
        return await self.controller.run(max_steps)

    def show(self, step: int) -> None:
        self.controller.show(step)

    @property
    def cursor(self) -> int | None:
        return self.controller.cursor

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        # where widgets cannot run (the static book, a plain notebook viewer) say what is missing
        bundle["text/html"] = ("<p><em>Live dashboard (Step, Run/Pause, step slider): run this notebook in "
                               "JupyterLab to drive it. The static figure further down shows the same views.</em></p>")
        bundle["text/plain"] = f"minillm Dashboard ({len(self.controller.trace)} steps recorded)"
        return bundle
