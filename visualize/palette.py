"""Colours and names shared by every view, so a state looks the same everywhere."""
from __future__ import annotations

# Block pool states (BlockState order)
BLOCK_COLORS = ("#eeeeee", "#9ecae9", "#4c78a8", "#f58518")
BLOCK_NAMES = ("free", "free, cached content", "used (ref 1)", "shared (ref > 1)")

# Sequence states in the batch timeline (SeqState order)
SEQ_COLORS = ("#d9d9d9", "#f58518", "#4c78a8", "#b279a2", "#bab0ac", "#e45756", "#54a24b")
SEQ_NAMES = ("waiting", "prefill chunk", "decode", "spec verify", "holds KV, not scheduled", "preempted", "finished")

# Step kinds on the roofline and in the token bars
KIND_COLORS = {"prefill": "#f58518", "decode": "#4c78a8", "mixed": "#72b7b2", "verify": "#b279a2"}
TOKEN_COLORS = {"prefill": "#f58518", "decode": "#4c78a8", "spec": "#b279a2"}

# Block events in a step
EVENT_COLORS = {"allocated": "#54a24b", "freed": "#888888", "evicted": "#e45756", "shared": "#f58518"}

CURSOR_COLOR = "#222222"


def discrete_colorscale(colors: tuple[str, ...]) -> list[list]:
    """A plotly colorscale mapping integers 0..n-1 (with zmin=0, zmax=n-1) to flat colours."""
    n = len(colors)
    if n == 1:
        return [[0.0, colors[0]], [1.0, colors[0]]]
    scale: list[list] = []
    for i, c in enumerate(colors):
        lo, hi = max(0.0, (i - 0.5) / (n - 1)), min(1.0, (i + 0.5) / (n - 1))
        scale += [[lo, c], [hi, c]]
    return scale
