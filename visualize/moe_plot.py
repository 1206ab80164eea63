"""Plotly rendering of the routing view (moe_view.py): tokens per expert per MoE layer as a heatmap."""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from minillm.engine.trace import StepTrace
from minillm.visualize.fit import fit_title
from minillm.visualize.moe_view import RoutingView, routing_view
from minillm.visualize.trace_index import clamp_step
from minillm.visualize.widgets import placeholder

META = "minillm-moe"  # names the panel in the page


def _named(fig: go.Figure) -> go.Figure:
    fig.update_layout(meta=META)
    return fig


def routing_heatmap(view: RoutingView) -> go.Heatmap:
    """Rows: MoE layers (top: the first); columns: experts; cells: tokens routed there."""
    hover = [[f"layer {layer}, expert {e}: {c} tokens ({share:.0%} of the layer's)"
              for e, (c, share) in enumerate(zip(row, view.share(r)))]
             for r, (layer, row) in enumerate(zip(view.layers, view.counts))]
    return go.Heatmap(z=[list(row) for row in view.counts], x=[f"expert {e}" for e in range(view.num_experts)],
                      y=[f"layer {layer} (CV {view.load_cv(r):.2f})" for r, layer in enumerate(view.layers)],
                      text=[list(row) for row in view.counts], texttemplate="%{text}", colorscale="Blues",
                      zmin=0, hovertext=hover, hovertemplate="%{hovertext}<extra></extra>",
                      colorbar=dict(title="tokens"), xgap=2, ygap=2)


def routing_figure(trace: Sequence[StepTrace], step: int | None = None, cumulative: bool = True) -> go.Figure:
    """Tokens per expert per layer over steps 0..step (cumulative) or in `step` alone; load CV per layer."""
    if not trace:
        return _named(placeholder("no engine steps yet: press Step"))
    view = routing_view(trace, step, cumulative)
    if view is None:
        return _named(placeholder(f"step {clamp_step(trace, step)}: a dense model (no experts to route to)"))
    first, last = view.first_step, view.last_step
    steps = f"steps {first}-{last}" if first != last else f"step {last}"
    fig = go.Figure(routing_heatmap(view))
    fig.update_layout(meta=META, yaxis=dict(autorange="reversed"), height=160 + 34 * len(view.layers),
                      margin=dict(l=20, r=20, b=40))
    fit_title(fig, f"Tokens per expert, {steps}: {view.num_tokens} tokens, each to {view.top_k} experts "
                   f"per layer (CV: load imbalance, 0 = even)")
    return fig
