"""A self-contained HTML report: the dashboard animated over the recorded steps.

One plotly figure with a frame per step and a slider; plotly.js is embedded
inline so the file opens offline. `minillm demo --html report.html` calls
`write_html_report(llm.trace, path)`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import plotly.graph_objects as go

from minillm.engine.trace import StepTrace
from minillm.visualize.dashboard_plot import build_dashboard, dashboard_frame
from minillm.visualize.roofline_view import Roofs

MAX_FRAMES = 150  # frames carry the pool per step; beyond this the file grows past a few MB


def frame_steps(num_steps: int, max_frames: int = MAX_FRAMES) -> list[int]:
    """Every step, or evenly spaced steps (always the first and the last) for long traces."""
    if num_steps <= max_frames:
        return list(range(num_steps))
    stride = (num_steps - 1) / (max_frames - 1)
    return sorted({round(k * stride) for k in range(max_frames)})


def report_figure(trace: Sequence[StepTrace], roofs: Roofs, max_frames: int = MAX_FRAMES) -> go.Figure:
    steps = frame_steps(len(trace), max_frames)
    fig, layout = build_dashboard(trace, roofs, steps[0])
    titles = [a for a in fig.layout.annotations if a.name != "caption"]
    fig.frames = [dashboard_frame(trace, roofs, s, layout, titles) for s in steps]
    anim = dict(mode="immediate", frame=dict(duration=0, redraw=True), transition=dict(duration=0))
    fig.update_layout(
        sliders=[dict(
            active=0, currentvalue=dict(prefix="step "), pad=dict(t=50), x=0.12, len=0.86,
            steps=[dict(label=str(s), method="animate", args=[[str(s)], anim]) for s in steps],
        )],
        updatemenus=[dict(
            type="buttons", direction="left", x=0, y=0, xanchor="left", yanchor="top", pad=dict(t=75),
            buttons=[
                dict(label="Play", method="animate",
                     args=[None, dict(mode="immediate", fromcurrent=True, frame=dict(duration=300, redraw=True),
                                      transition=dict(duration=0))]),
                dict(label="Pause", method="animate", args=[[None], anim]),
            ],
        )],
    )
    fig.update_layout(height=fig.layout.height + 120, margin_b=140)
    return fig


def write_html_report(trace: Sequence[StepTrace], path: str | Path, roofs: Roofs | None = None,
                      device: str | None = None, dtype: str = "float32", max_frames: int = MAX_FRAMES,
                      title: str = "minillm step trace") -> Path:
    """Write the animated dashboard of `trace` to `path`.

    The roofline's roofs default to this machine's (measured once, cached) for `device`
    (default: CUDA when available, as LLM() does, else the CPU) and the weights' `dtype`.
    """
    if not trace:
        raise ValueError("the trace is empty: run the engine for at least one step")
    if roofs is None:
        import torch

        from minillm.visualize.roofs import machine_roofs

        roofs = machine_roofs(device or ("cuda" if torch.cuda.is_available() else "cpu"), dtype)
    fig = report_figure(list(trace), roofs, max_frames)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    html = fig.to_html(include_plotlyjs=True, full_html=True, auto_play=False, div_id="minillm-report")
    html = html.replace("<head>", f"<head><title>{title}</title>", 1)
    path.write_text(html, encoding="utf-8")
    return path
