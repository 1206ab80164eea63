"""The HTML report's size (issue 16): one inline plotly.js plus a compact figure whose frames still carry every step.

Measured on `minillm demo --html` (default model, 16 prompts, 48 steps, a 728-block pool): 8.33 MB, of it
4.82 MB plotly.js and 3.52 MB figure; a frame was ~70 kB, 59 kB of it the pool's hover text (~81 bytes a
block). Now a frame of that pool is ~20 kB: ~21 bytes a block of hover fields, ~2 of colours, ~3.6 kB of
queue, tables, cursor and caption. The budget allows 32 bytes a block + 8 kB a frame (1.5x the frames
measured here); the old report's frames are 1.8x over it. Outside the frames: ~95-115 kB for 45-48 steps.
"""
from __future__ import annotations

import copy
import json
import re

import pytest

pytest.importorskip("plotly")

from plotly.offline import get_plotlyjs

from minillm.visualize import Roofs
from minillm.visualize.dashboard_plot import build_dashboard
from minillm.visualize.report import write_html_report
from tests.helpers.engine_utils import greedy, make_engine, random_prompts, run_to_completion, tiny_model

ROOFS = Roofs(bandwidth=20e9, peak_flops=1e12, label="test")
NUM_BLOCKS = 728  # the default model's pool in `minillm demo` on the CPU
BYTES_PER_BLOCK = 32  # a frame's budget: per pool block ...
BYTES_PER_FRAME = 8_000  # ... plus queue, tables, cursor, caption
BYTES_BASE, BYTES_PER_STEP = 40_000, 2_500  # the figure outside the frames: template; slider, timeline per step


@pytest.fixture(scope="module")
def trace():
    """12 requests of different lengths through a demo-sized pool: allocations, frees, cached blocks."""
    engine = make_engine(tiny_model(), num_blocks=NUM_BLOCKS, block_size=4, max_num_seqs=8, max_num_batched_tokens=64)
    for i, prompt in enumerate(random_prompts(12, 97, 6, 40, seed=16)):
        engine.add_request(f"r{i}", prompt, greedy(8 + 2 * i))
    run_to_completion(engine)
    return engine.trace


def embedded_figure(html: str) -> dict:
    """data, layout and frames as the page hands them to Plotly.newPlot and Plotly.addFrames."""
    dec = json.JSONDecoder()

    def args_after(call: str) -> list:
        m = re.search(re.escape(call) + r"\(\s*['\"]minillm-report['\"]\s*,\s*", html)
        assert m, call
        out, pos = [], m.end()
        while True:
            value, pos = dec.raw_decode(html, pos)
            out.append(value)
            sep = re.match(r"\s*,\s*", html[pos:])
            if not sep or html[pos + sep.end()] not in "[{":
                return out
            pos += sep.end()

    data, layout, *_ = args_after("Plotly.newPlot")
    (frames,) = args_after("Plotly.addFrames")
    return {"data": data, "layout": layout, "frames": frames}


def merge(target: dict, update: dict, containers: tuple[str, ...] = ()) -> None:
    """What Plotly.animate does with a frame (plotly.js Plots.transition): objects merge, arrays replace,
    and layout annotations/shapes merge item by item."""
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v)
        elif k in containers and isinstance(v, list) and isinstance(target.get(k), list):
            for i, item in enumerate(v):
                if i < len(target[k]) and isinstance(item, dict) and isinstance(target[k][i], dict):
                    merge(target[k][i], item)
                else:
                    target[k][i:i + 1] = [copy.deepcopy(item)]
        else:
            target[k] = copy.deepcopy(v)


def animate(fig: dict, name: str) -> None:
    frame = next(f for f in fig["frames"] if f["name"] == name)
    for idx, tr in zip(frame["traces"], frame["data"]):
        merge(fig["data"][idx], tr)
    merge(fig["layout"], frame.get("layout", {}), containers=("annotations", "shapes"))


def hover_lines(tr: dict, r: int, k: int) -> list[str]:
    """The pool cell's hover as plotly words it (%{hovertext} and %{customdata[i]} filled in), line by line."""
    def value(key: str):
        if key == "hovertext":
            return tr["hovertext"][r][k]
        return tr["customdata"][r][k][int(re.fullmatch(r"customdata\[(\d+)\]", key)[1])]

    text = re.sub(r"%\{([^}:]+)\}", lambda m: str(value(m[1])), tr["hovertemplate"]).replace("<extra></extra>", "")
    return text.split("<br>")


def assert_shows_step(fig: dict, trace, step: int) -> None:
    """The animated report at `step` shows what the dashboard drawn at `step` shows."""
    want, dash = build_dashboard(trace, ROOFS, step)
    want = want.to_plotly_json()
    got = fig["data"]
    for idx in dash.tables + dash.pool[1:] + dash.queue:
        for key in ("z", "text", "hovertext", "x", "y", "customdata"):
            assert json.loads(json.dumps(want["data"][idx].get(key))) == got[idx].get(key), (step, idx, key)
    (ring,) = dash.cursor_ring
    assert got[ring]["hovertext"] == list(want["data"][ring]["hovertext"])
    assert got[ring]["x"] == pytest.approx(list(want["data"][ring]["x"]), rel=1e-3)
    assert got[ring]["y"] == pytest.approx(list(want["data"][ring]["y"]), rel=1e-3)
    pool, wpool = got[dash.pool[0]], want["data"][dash.pool[0]]
    assert pool["z"] == json.loads(json.dumps(wpool["z"]))
    assert pool["text"] == json.loads(json.dumps(wpool["text"]))
    for r, row in enumerate(wpool["hovertext"]):
        for k, expected in enumerate(row):
            if not expected:  # padding after the last block
                continue
            shown = hover_lines(pool, r, k)
            # the same facts; a held block also says it is not in the free queue
            assert shown[:2] == expected.split("<br>")[:2], (step, r, k)
            assert sorted(x for x in shown if x != "free queue position none") == sorted(expected.split("<br>"))
    assert [a["text"] for a in fig["layout"]["annotations"]] == [a["text"] for a in want["layout"]["annotations"]]
    assert [(s["x0"], s["x1"]) for s in fig["layout"]["shapes"]] == [(step, step)] * 2
    assert fig["layout"][dash.tables_yaxis]["ticktext"] == list(want["layout"][dash.tables_yaxis]["ticktext"])


def test_report_is_compact_and_its_frames_carry_every_step(trace, tmp_path):
    assert 40 <= len(trace) <= 50 and trace[0].num_blocks == NUM_BLOCKS
    assert any(r.blocks_freed for r in trace) and any(any(r.block_cached) for r in trace)
    html = write_html_report(trace, tmp_path / "report.html", roofs=ROOFS).read_text(encoding="utf-8")
    plotly_js = get_plotlyjs()
    assert html.count(plotly_js) == 1 and not re.search(r"<script[^>]+src=", html)  # one copy, inline

    fig = embedded_figure(html)
    frames = fig["frames"]
    assert [f["name"] for f in frames] == [str(s) for s in range(len(trace))]
    frame_bytes = len(json.dumps(frames, separators=(",", ":")))
    budget = len(frames) * (BYTES_PER_BLOCK * NUM_BLOCKS + BYTES_PER_FRAME)
    assert frame_bytes <= budget, f"frames {frame_bytes} bytes > {budget}"
    total = len(html.encode())
    limit = len(plotly_js.encode()) + BYTES_BASE + BYTES_PER_STEP * len(trace) + budget
    assert total <= limit, f"report {total} bytes > {limit}"

    # the slider moves to the last step, back to the middle (frames are applied in any order), then the first
    last, mid = len(trace) - 1, len(trace) // 2
    for step in (last, mid, 0):
        animate(fig, str(step))
        assert_shows_step(fig, trace, step)
