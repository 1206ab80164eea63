"""End to end in a real browser: JupyterLab runs a notebook with the live dashboard, we click Step.

Every dashboard must draw all its panels with no console error, also when its cell is run again.

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
PANELS = ("minillm-block-table", "minillm-timeline", "minillm-roofline")
SPEC_PANELS = PANELS + ("minillm-spec",)  # an engine that speculates also shows its guesses


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
# the number of traces each drawn view has (a view that failed to draw has none, or no meta)
PANEL_TRACES = """() => Object.fromEntries([...document.querySelectorAll('.js-plotly-plot')]
  .map(d => [(d.layout && d.layout.meta) || 'unnamed', (d.data || []).length]))"""
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

    def rerun_cell(self, index: int) -> None:
        self.page.wait_for_function(KERNEL_IDLE, timeout=120_000)
        self.page.evaluate(f"""() => {{ const nb = window.jupyterapp.shell.currentWidget.content;
            nb.activeCellIndex = {index}; return window.jupyterapp.commands.execute('notebook:run-cell'); }}""")

    def steps_drawn(self) -> int:
        """Columns of the timeline grid: one per recorded step, as drawn in the page."""
        z = self.page.evaluate(GRAPH_Z, "minillm-timeline")
        return len(json.loads(z)[0]) if z else 0

    def wait_steps(self, n: int, timeout: int = 60_000) -> None:
        self.page.wait_for_function(
            f"() => {{ const z = ({GRAPH_Z})('minillm-timeline'); return z && JSON.parse(z)[0].length === {n}; }}",
            timeout=timeout)

    def panels(self) -> dict[str, int]:
        return self.page.evaluate(PANEL_TRACES)

    def assert_all_panels_drawn(self, timeout: int = 30_000, expected: tuple[str, ...] = PANELS) -> None:
        """Every view drawn (waiting for a slow page up to `timeout`) and nothing logged as an error."""
        want = json.dumps(sorted(expected))
        try:
            self.page.wait_for_function(
                f"() => {{ const p = ({PANEL_TRACES})(); const k = Object.keys(p).sort();"
                f" return JSON.stringify(k) === {json.dumps(want)} && Object.values(p).every(n => n > 0); }}",
                timeout=timeout)
        except PlaywrightTimeout:
            pass  # the assert below says what is missing
        panels = self.panels()
        assert set(panels) == set(expected) and all(panels.values()), panels
        assert not self.errors, self.errors


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
            assert page.locator(".widget-html", has_text="step 1 of 1").count() == 1

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
            assert page.locator(".widget-html", has_text=f"step {n + 1} of {n + 1}").count() == 1
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
            assert page.locator(".widget-html", has_text="step 0 of").count() == 1
            nb.assert_all_panels_drawn()
        finally:
            browser.close()
