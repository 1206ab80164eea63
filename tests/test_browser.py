"""End to end in a real browser: JupyterLab runs a notebook with the live dashboard, we click Step.

Every dashboard must draw all its panels, each with data, with no console error and no stderr output
in the notebook, also when its cell is run again. Besides the plain, speculative and recorded-trace
dashboards, one notebook holds the course's other live views side by side in one kernel: the
scheduling lanes (notebook 12), the radix prefix tree (06), MoE routing (13) and notebook 04's Triton
tile explorer (its own cell, read from the notebook).

Headless Chromium (Debian's /usr/bin/chromium; Playwright's own browser
download does not work here) driven by the `playwright` package. JupyterLab
listens on 127.0.0.1 on a free port with a random token. The test reads the
plotly graphs' data in the page, so it checks what the reader sees, not
Python state.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("MINILLM_CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent

if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set MINILLM_CHROMIUM)",
                allow_module_level=True)

# With a browser present the rest must be installed too (pip install -e ".[notebooks]"):
# a missing package is a failure here, not a skip.
import nbformat  # noqa: E402
import jupyterlab  # noqa: E402,F401
from playwright.sync_api import TimeoutError as PlaywrightTimeout, sync_playwright  # noqa: E402  (its own browser download is not needed)

pytestmark = pytest.mark.slow

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]

SETUP = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
         "from tests.helpers.engine_utils import greedy, make_engine, tiny_model\n"
         "from minillm.visualize import Dashboard, Roofs")
CELLS = [
    SETUP,
    "engine = make_engine(tiny_model(), num_blocks=24, block_size=4, max_num_seqs=4, max_num_batched_tokens=16)\n"
    "for i in range(6):\n"
    "    engine.add_request(f'r{i}', [3 + i] * (6 + i), greedy(40))",
    # interval_s: Run takes a visible while, so Pause lands while it is still running
    "dash = Dashboard(engine, roofs=Roofs(20e9, 1e12, 'assumed'), interval_s=0.3)\ndash.step()\ndash",
]
# As notebook 09 does: the engine already ran (speculative verify steps in its trace) when the
# dashboard is built, and the reader re-runs the dashboard cell.
SPEC_CELLS = [
    SETUP + "\nfrom minillm.engine.config import EngineConfig\nfrom minillm.engine.llm_engine import LLMEngine",
    "engine = LLMEngine(tiny_model(), None, [], EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=4,\n"
    "    max_num_batched_tokens=64, speculative={'method': 'ngram', 'num_tokens': 3}))\n"
    "engine.add_request('a', [3, 4, 5, 6] * 5, greedy(20))\n"
    "while engine.has_unfinished_requests():\n"
    "    engine.step()\n"
    "assert any(t.num_spec_tokens for t in engine.trace)\n"
    "engine.add_request('b', [3, 4, 5, 6] * 5, greedy(30))",
    "dash = Dashboard(engine, roofs=Roofs(20e9, 1e12, 'assumed'))\ndash.step()\ndash",
]
# As notebook 11 does: a recorded trace, scrubbed without an engine.
TRACE_CELLS = [
    SETUP,
    "engine = make_engine(tiny_model(), num_blocks=24, block_size=4, max_num_seqs=4, max_num_batched_tokens=16)\n"
    "for i in range(4):\n"
    "    engine.add_request(f'r{i}', [3 + i] * (6 + i), greedy(6))\n"
    "while engine.has_unfinished_requests():\n"
    "    engine.step()",
    "dash = Dashboard.from_trace(list(engine.trace), roofs=Roofs(20e9, 1e12, 'assumed'))\ndash",
    "dash.show(0)  # what dragging the slider to step 0 does",
]
# The other dashboard kinds (notebooks 12, 06, 13) on tiny models, and notebook 04's tile explorer, in one kernel.
VIEWS_SETUP = ('import os\nos.environ["TRITON_INTERPRET"] = "1"  # as notebook 04: before triton is imported\n'
               + SETUP + "\nimport torch\nfrom minillm.config import ModelConfig\n"
               "from minillm.engine.config import EngineConfig\nfrom minillm.engine.llm_engine import LLMEngine\n"
               "from minillm.models.moe_models import MixtralForCausalLM\n"
               "from minillm.kernels.testing import make_paged_workload\n"
               "from minillm.kernels.trace_tiles import tile_figure, tile_view, trace_paged_decode, trace_prefill\n"
               "ROOFS = Roofs(20e9, 1e12, 'assumed')")
VIEWS_ENGINES = """\
model = tiny_model()
def engine(**knobs):
    return LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=2,
                                                   max_num_batched_tokens=32, **knobs))
# notebook 12: two lanes, long stories hold the seats they may while chats arrive
lanes_engine = engine(scheduling_policy="length-aware", short_lane_max_tokens=20)
for i in range(3):
    lanes_engine.add_request(f"long{i}", [4 + i] * 6, greedy(20))
for i in range(3):
    lanes_engine.add_request(f"chat{i}", [7 + i] * 3, greedy(3))
# notebook 06: a radix cache holding a first request's prompt, then three that share its start
radix_engine = engine(prefix_cache="radix")
radix_engine.add_request("first", list(range(3, 23)), greedy(4))
while radix_engine.has_unfinished_requests():
    radix_engine.step()
for i in range(3):
    radix_engine.add_request(f"q{i}", list(range(3, 19)) + [40 + i] * 3, greedy(8))
# notebook 13: a tiny random Mixtral (4 experts, top-2)
torch.manual_seed(0)
moe_cfg = ModelConfig(model_type="mixtral", vocab_size=97, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      num_experts=4, num_experts_per_tok=2, eos_token_id=[])
moe_engine = LLMEngine(MixtralForCausalLM(moe_cfg).eval(), None, [],
                       EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=32))
for i in range(3):
    moe_engine.add_request(f"m{i}", [5 + i] * (6 + i), greedy(12))
# notebook 04's workloads, smaller: what its explorer cell reads (dw, dec, pre, SCALE)
H, KVH, D, PAGE = 2, 1, 16, 4
SCALE = D ** -0.5
dw = make_paged_workload(query_lens=[1, 1], seq_lens=[45, 23], num_heads=H, num_kv_heads=KVH, head_dim=D,
                         block_size=PAGE, dtype=torch.float32, seed=0)
dec = trace_paged_decode(dw.q, dw.k_cache, dw.v_cache, dw.block_tables, dw.seq_lens, SCALE, block_n=16)
pw = make_paged_workload(query_lens=[40, 12], seq_lens=[40, 30], num_heads=H, num_kv_heads=KVH, head_dim=D,
                         block_size=PAGE, dtype=torch.float32, seed=1)
pre = trace_prefill(pw.q, pw.k_cache, pw.v_cache, pw.cu_seqlens_q, pw.seq_lens, pw.block_tables, SCALE,
                    block_m=16, block_n=16)"""
EXPLORER_MARK = "explorer = widgets.VBox"


def explorer_cell() -> str:
    """Notebook 04's tile explorer cell, as the reader runs it."""
    nb = nbformat.read(ROOT / "notebooks" / "04_triton_kernels.ipynb", as_version=4)
    found = [c.source for c in nb.cells if c.cell_type == "code" and EXPLORER_MARK in c.source]
    assert len(found) == 1, f"notebook 04 has {len(found)} cells with {EXPLORER_MARK!r}"
    return found[0]


PANELS = ("minillm-block-table", "minillm-timeline", "minillm-roofline")
SPEC_PANELS = PANELS + ("minillm-spec",)  # an engine that speculates also shows its guesses
# views.ipynb: cell index -> the panels that cell draws (a dashboard's extra view follows from its engine)
DASHBOARD_CELLS = {2: PANELS + ("minillm-lanes",), 3: PANELS + ("minillm-prefix-tree",), 4: PANELS + ("minillm-moe",)}
EXPLORER = 5


def views_cells() -> list[str]:
    return [VIEWS_SETUP, VIEWS_ENGINES,
            "lanes = Dashboard(lanes_engine, roofs=ROOFS)\nlanes.step()\nlanes",
            "tree = Dashboard(radix_engine, roofs=ROOFS)\ntree.step()\ntree",
            "moe = Dashboard(moe_engine, roofs=ROOFS)\nassert moe.routing is not None\nmoe.step()\nmoe",
            explorer_cell()]


def write_notebook(root: Path, name: str, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"JupyterLab did not answer at {url}")


@pytest.fixture()
def lab(tmp_path):
    # one JupyterLab per test: a shared one reopens the previous test's notebook (its workspace) in the page
    write_notebook(tmp_path, "dashboard.ipynb", CELLS)
    write_notebook(tmp_path, "spec_dashboard.ipynb", SPEC_CELLS)
    write_notebook(tmp_path, "trace_dashboard.ipynb", TRACE_CELLS)
    write_notebook(tmp_path, "views.ipynb", views_cells())
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), OMP_NUM_THREADS="1")
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly",
         "--ServerApp.terminals_enabled=False"] + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
    )
    try:
        wait_for_server(f"http://127.0.0.1:{port}/api/status?token={token}", proc)
        yield f"http://127.0.0.1:{port}", token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if proc.returncode not in (0, -15, None):
            print((tmp_path / "lab.log").read_text()[-3000:])


# JS run in the page: the z data of the plotly graph whose layout.meta names the view
GRAPH_Z = """meta => {
  const g = [...document.querySelectorAll('.js-plotly-plot')].find(d => d.layout && d.layout.meta === meta);
  return g ? JSON.stringify(g.data[0].z) : null;
}"""
# the page, or the output of notebook cell `cell` (null: the whole page)
ROOT_OF = ("(cell => cell === null ? document"
           " : window.jupyterapp.shell.currentWidget.content.widgets[cell].node)")
# per drawn view (by meta; a view that failed to draw has no meta): per subplot (x axis of the layout), the finite
# numbers in its traces' x, y and z as plotly drew them (a subplot without traces, or a placeholder, counts 0)
PANEL_DATA = f"""cell => {{
  const finite = v => (Array.isArray(v) || ArrayBuffer.isView(v)) ? Array.from(v).reduce((n, x) => n + finite(x), 0)
                      : (typeof v === 'number' && isFinite(v) ? 1 : 0);
  return Object.fromEntries([...{ROOT_OF}(cell).querySelectorAll('.js-plotly-plot')].map(d => {{
    // every x axis the layout declares (plotly.js itself lists only those with traces)
    const axes = Object.fromEntries(Object.keys(d.layout || {{}}).filter(k => /^xaxis\\d*$/.test(k))
                                    .map(k => ['x' + k.slice(5), 0]));
    for (const t of d._fullData || []) {{
      const a = t.xaxis || 'x';
      axes[a] = (axes[a] || 0) + finite(t.x) + finite(t.y) + finite(t.z);
    }}
    return [(d.layout && d.layout.meta) || 'unnamed', axes];
  }}));
}}"""
# the z data of the graph named `meta` in the output of cell `cell`
CELL_Z = f"""([cell, meta]) => {{
  const g = [...{ROOT_OF}(cell).querySelectorAll('.js-plotly-plot')].find(d => d.layout && d.layout.meta === meta);
  return g ? JSON.stringify(g.data[0].z) : null;
}}"""
# subplots that are empty in some steps by design: no block tables after a step in which every sequence finished
MAY_BE_EMPTY = {"minillm-block-table": ["x3"]}
STDERR = """() => [...document.querySelectorAll(
  '.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]')].map(e => e.textContent)"""
KERNEL_IDLE = ("() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
               " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
               " && w.sessionContext.session.kernel.status === 'idle'; }")


class Page:
    """A notebook open in JupyterLab, with every console error and uncaught exception it logs."""

    def __init__(self, browser, base: str, token: str, name: str) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 1600})
        self.errors: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.goto(f"{base}/lab/tree/{name}?token={token}")
        self.page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook')", timeout=90_000)
        self.page.wait_for_function(KERNEL_IDLE, timeout=90_000)

    def run_all(self) -> None:
        self.page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")

    def cell(self, index: int):
        """The locator of notebook cell `index` (input and output)."""
        return self.page.locator(".jp-Notebook .jp-Cell").nth(index)

    def rerun_cell(self, index: int) -> None:
        self.page.wait_for_function(KERNEL_IDLE, timeout=120_000)
        self.page.evaluate(f"""() => {{ const nb = window.jupyterapp.shell.currentWidget.content;
            nb.activeCellIndex = {index}; return window.jupyterapp.commands.execute('notebook:run-cell'); }}""")

    def steps_drawn(self, cell: int | None = None) -> int:
        """Columns of the timeline grid (in `cell`'s output, or the page's first): one per recorded step."""
        z = self.page.evaluate(CELL_Z, [cell, "minillm-timeline"])
        return len(json.loads(z)[0]) if z else 0

    def wait_steps(self, n: int, timeout: int = 60_000, cell: int | None = None) -> None:
        self.page.wait_for_function(
            f"() => {{ const z = ({CELL_Z})([{json.dumps(cell)}, 'minillm-timeline']);"
            f" return z && JSON.parse(z)[0].length === {n}; }}", timeout=timeout)

    def panels(self, cell: int | None = None) -> dict[str, dict[str, int]]:
        return self.page.evaluate(PANEL_DATA, cell)

    def stderr(self) -> list[str]:
        return self.page.evaluate(STDERR)

    def assert_all_panels_drawn(self, timeout: int = 30_000, expected: tuple[str, ...] = PANELS,
                                cell: int | None = None) -> None:
        """Every view drawn with data in each of its subplots (waiting for a slow page up to `timeout`), in the
        page or in `cell`'s output; nothing logged as an error, no stderr output anywhere in the notebook."""
        want = json.dumps(sorted(expected), separators=(",", ":"))  # as JSON.stringify writes it
        try:
            self.page.wait_for_function(
                f"() => {{ const p = ({PANEL_DATA})({json.dumps(cell)}); const k = Object.keys(p).sort();"
                f" return JSON.stringify(k) === {json.dumps(want)} && Object.entries(p).every(([m, a]) =>"
                f" Object.keys(a).length > 0 && Object.entries(a).every(([x, n]) => n > 0 ||"
                f" ({json.dumps(MAY_BE_EMPTY)}[m] || []).includes(x))); }}",
                timeout=timeout)
        except PlaywrightTimeout:
            pass  # the assert below says what is missing
        panels = self.panels(cell)
        assert set(panels) == set(expected), panels
        empty = {m: [x for x, n in axes.items() if not n and x not in MAY_BE_EMPTY.get(m, ())] if axes else ["-"]
                 for m, axes in panels.items()}
        assert not any(empty.values()), f"views or subplots without data: {empty} (all: {panels})"
        assert not self.errors, self.errors
        assert not self.stderr(), self.stderr()


def test_step_click_updates_block_table_and_timeline(lab):
    base, token = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            nb = Page(browser, base, token, "dashboard.ipynb")
            page = nb.page
            nb.run_all()
            step = page.locator("button.jupyter-button", has_text="Step")
            step.wait_for(timeout=120_000)
            page.wait_for_function(f"({GRAPH_Z})('minillm-timeline') !== null", timeout=60_000)
            page.wait_for_function(f"({GRAPH_Z})('minillm-block-table') !== null", timeout=60_000)
            pool0 = page.evaluate(GRAPH_Z, "minillm-block-table")
            grid0 = page.evaluate(GRAPH_Z, "minillm-timeline")
            assert len(json.loads(grid0)[0]) == 1  # one step recorded so far
            nb.assert_all_panels_drawn()

            step.click()
            page.wait_for_function(f"({GRAPH_Z})('minillm-timeline') !== {json.dumps(grid0)}", timeout=60_000)
            page.wait_for_function(f"({GRAPH_Z})('minillm-block-table') !== {json.dumps(pool0)}", timeout=60_000)
            grid1 = json.loads(page.evaluate(GRAPH_Z, "minillm-timeline"))
            assert len(grid1[0]) == 2  # the timeline grew by the step we clicked
            page.locator(".widget-html", has_text="step 1 of 1").wait_for(timeout=30_000)  # the status line comes last

            # Run keeps the page responsive: Pause is clickable while steps are being taken
            run = page.locator("button.jupyter-button", has_text="Run")
            run.click()
            page.wait_for_function(f"JSON.parse(({GRAPH_Z})('minillm-timeline'))[0].length >= 4", timeout=60_000)
            page.locator("button.jupyter-button", has_text="Pause").click()
            page.locator("button.jupyter-button", has_text="Run").wait_for(timeout=30_000)
            n_paused = nb.steps_drawn()
            page.wait_for_timeout(1500)
            assert nb.steps_drawn() == n_paused
            assert n_paused < 40  # paused long before the requests could finish
            nb.assert_all_panels_drawn()
            if os.environ.get("MINILLM_BROWSER_SCREENSHOT"):  # to look at what the reader saw
                page.screenshot(path=os.environ["MINILLM_BROWSER_SCREENSHOT"], full_page=True)
        finally:
            browser.close()


def test_dashboard_after_a_recorded_run_draws_every_panel_and_steps_after_a_rerun(lab):
    """Notebook 09's case: built on an engine with a speculative trace, then its cell is run again."""
    base, token = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            nb = Page(browser, base, token, "spec_dashboard.ipynb")
            page = nb.page
            nb.run_all()
            page.locator("button.jupyter-button", has_text="Step").wait_for(timeout=120_000)
            page.wait_for_function(f"({GRAPH_Z})('minillm-timeline') !== null", timeout=60_000)
            page.wait_for_function(KERNEL_IDLE, timeout=120_000)
            nb.assert_all_panels_drawn(expected=SPEC_PANELS)
            n = nb.steps_drawn()
            assert n > 2  # the earlier run's steps and the dashboard's own

            nb.rerun_cell(2)  # a new Dashboard on the same engine; it takes one step
            nb.wait_steps(n + 1)
            page.wait_for_function(KERNEL_IDLE, timeout=120_000)
            nb.assert_all_panels_drawn(expected=SPEC_PANELS)
            step = page.locator("button.jupyter-button", has_text="Step")
            assert step.count() == 1  # the old output was replaced
            step.click()
            nb.wait_steps(n + 2)
            page.locator(".widget-html", has_text=f"step {n + 1} of {n + 1}").wait_for(timeout=30_000)
            nb.assert_all_panels_drawn(expected=SPEC_PANELS)
        finally:
            browser.close()


def test_recorded_trace_dashboard_draws_every_panel_and_scrubs(lab):
    """Notebook 11's case: Dashboard.from_trace, no engine; moving the cursor redraws the block table."""
    base, token = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            nb = Page(browser, base, token, "trace_dashboard.ipynb")
            page = nb.page
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-cell')")  # setup only
            page.wait_for_function(KERNEL_IDLE, timeout=120_000)
            nb.rerun_cell(1)
            nb.rerun_cell(2)  # the dashboard at the last recorded step
            page.wait_for_function(f"({GRAPH_Z})('minillm-block-table') !== null", timeout=120_000)
            page.wait_for_function(KERNEL_IDLE, timeout=120_000)
            nb.assert_all_panels_drawn()
            last = page.evaluate(GRAPH_Z, "minillm-block-table")
            nb.rerun_cell(3)  # dash.show(0)
            page.wait_for_function(f"({GRAPH_Z})('minillm-block-table') !== {json.dumps(last)}", timeout=60_000)
            page.locator(".widget-html", has_text="step 0 of").wait_for(timeout=30_000)
            nb.assert_all_panels_drawn()
        finally:
            browser.close()


# JS: the title of the graph whose meta ends in " tiles" (the explorer's), in cell `cell`'s output
TILE_TITLE = f"""cell => {{
  const g = [...{ROOT_OF}(cell).querySelectorAll('.js-plotly-plot')].find(d => d.layout && /tiles$/.test(d.layout.meta));
  return g ? `${{g.layout.meta}}: ${{g.layout.title.text}}` : null;
}}"""


def test_lanes_prefix_tree_moe_dashboards_and_tile_explorer_draw_every_panel(lab):
    """Notebooks 12, 06, 13 and 04's live views in one kernel: every panel with data, no console error and
    no stderr; each dashboard's cell re-run, then Step advances it; the explorer's kernel menu and slider."""
    base, token = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            nb = Page(browser, base, token, "views.ipynb")
            page = nb.page
            nb.run_all()
            nb.cell(EXPLORER).locator("select").wait_for(timeout=180_000)
            page.wait_for_function(KERNEL_IDLE, timeout=180_000)
            for cell, panels in DASHBOARD_CELLS.items():
                nb.assert_all_panels_drawn(expected=panels, cell=cell)
            nb.assert_all_panels_drawn(expected=("paged_decode tiles",), cell=EXPLORER)

            for cell, panels in DASHBOARD_CELLS.items():
                n = nb.steps_drawn(cell)
                assert n >= 1, (cell, n)
                nb.rerun_cell(cell)  # a new Dashboard on the same engine; it takes one step
                nb.wait_steps(n + 1, cell=cell)
                page.wait_for_function(KERNEL_IDLE, timeout=120_000)
                step = nb.cell(cell).locator("button.jupyter-button", has_text="Step")
                assert step.count() == 1  # the old output was replaced
                step.click()
                nb.wait_steps(n + 2, cell=cell)
                # the status line follows the figures (the controller updates it last)
                nb.cell(cell).locator(".widget-html", has_text=f"step {n + 1} of {n + 1}").wait_for(timeout=30_000)
                nb.assert_all_panels_drawn(expected=panels, cell=cell)

            # the explorer: pick the prefill kernel (causal mask: NaN cells), then move its slider two steps
            explorer = nb.cell(EXPLORER)
            explorer.locator("select").select_option(index=1)
            page.wait_for_function(f"/^prefill tiles: prefill, step 1\\//.test(({TILE_TITLE})({EXPLORER}))",
                                   timeout=60_000)
            nb.assert_all_panels_drawn(expected=("prefill tiles",), cell=EXPLORER)
            for _ in range(2):
                explorer.locator(".noUi-handle").press("ArrowRight")
            page.wait_for_function(f"/^prefill tiles: prefill, step 3\\//.test(({TILE_TITLE})({EXPLORER}))",
                                   timeout=60_000)
            nb.assert_all_panels_drawn(expected=("prefill tiles",), cell=EXPLORER)
        finally:
            browser.close()
