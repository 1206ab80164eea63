"""The course notebooks: committed stripped, every cell executed under nbval, and the book built from them.

The fast tests check the notebooks as files. The slow one is what CI runs to execute them:

    MINILLM_EXECUTED_NOTEBOOKS=DIR python scripts/run_notebooks.py   # nbval per notebook, in CPU-pinned lanes
    MINILLM_EXECUTED_NOTEBOOKS=DIR bash scripts/build_book.sh

nbval executes every cell (and compares the few outputs marked NBVAL_CHECK_OUTPUT); the
notebooks' conftest keeps the executed copies in DIR, and the book is built from those, so each
notebook runs once.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MINE = ["00_quickstart", "01_prefill_vs_decode_roofline", "02_kv_cache_memory", "03_paged_attention_block_tables",
        "05_continuous_vs_static_batching", "06_prefix_caching", "07_scheduling_knobs", "08_quantization", "09_speculative_decoding",
        "10_tensor_parallelism",
        "11_serving_metrics", "12_priorities_and_the_tail", "13_moe_routing",
        "14_exercises"]


def load(path: Path):
    return nbformat.read(path, as_version=4)


def code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_the_course_is_there():
    names = {p.stem for p in NOTEBOOKS}
    assert set(MINE) <= names, sorted(set(MINE) - names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_stripped(path):
    """No outputs, counts or widget state, except the small text outputs nbval compares."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from strip_notebooks import CHECK_MARK, strip
    finally:
        sys.path.pop(0)
    nb = load(path)
    assert "widgets" not in nb.metadata
    assert nbformat.writes(strip(nb)) == nbformat.writes(nb), f"run: python scripts/strip_notebooks.py {path.relative_to(ROOT)}"
    for cell in nb.cells:
        if cell.cell_type == "code" and CHECK_MARK in cell.source:
            assert cell.outputs, f"{path.name}: a {CHECK_MARK} cell needs its reference output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_cell_has_an_id(path):
    """nbformat 4.5 wants a unique id on every cell (nbformat warns MissingIDFieldWarning, and nbval
    and the strip script's executed-output lookup key cells by id)."""
    import json

    cells = json.loads(path.read_text())["cells"]
    missing = [k for k, c in enumerate(cells) if not c.get("id")]
    assert not missing, f"{path.name}: cells {missing} have no id"
    ids = [c["id"] for c in cells]
    assert len(set(ids)) == len(ids), f"{path.name}: duplicate cell ids"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_cell_runs_under_nbval(path):
    """nbval --nbval-lax must execute every cell: no skip markers, no expected exceptions."""
    nb = load(path)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    for src in code(nb):
        assert not re.search(r"NBVAL_(SKIP|RAISES_EXCEPTION|IGNORE_OUTPUT)", src), src[:80]
    for cell in nb.cells:
        assert not set(cell.metadata.get("tags", [])) & {"nbval-skip", "raises-exception", "skip-execution"}


@pytest.mark.parametrize("name", MINE)
def test_each_chapter_runs_the_engine_live_and_static(name):
    """One topic each: the real default model, a live widget, a static figure, a measured claim."""
    src = "\n".join(code(load(ROOT / "notebooks" / f"{name}.ipynb")))
    assert "LLM(" in src, "runs the real engine on the default model"
    assert "Dashboard(" in src, "shows a live widget"
    assert "show_figure(" in src, "shows a static figure"
    # a measured claim is checked inline or through minillm/bench/course_claims.py
    assert ("assert " in src or re.search(r"\bcheck_\w+\(", src)) and "print(" in src, \
        "checks and prints a measured claim"
    md = "\n".join(c.source for c in load(ROOT / "notebooks" / f"{name}.ipynb").cells if c.cell_type == "markdown")
    assert "Claim" in md, "names the claim from the literature it reproduces"


@pytest.mark.slow
def test_notebooks_execute_under_nbval_and_the_book_builds(tmp_path):
    missing = [m for m in ("nbval", "jupyter_book", "nbclient", "plotly", "ipywidgets", "anywidget")
               if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"notebook extras not installed ({', '.join(missing)}): pip install -e '.[notebooks]'")
    if shutil.which("bash") is None:
        pytest.skip("scripts/build_book.sh needs bash")
    env = dict(os.environ, MINILLM_EXECUTED_NOTEBOOKS=str(tmp_path / "executed"))
    if env.pop("MINILLM_TESTS_PINNED_ROUTE", None):  # the suite's route pin (conftest.py), not the reader's
        env.pop("MINILLM_QUANT_CPU_ROUTE", None)
    # scripts/run_notebooks.py: nbval per notebook, in lanes pinned to their own CPUs (2 on a 2-core machine)
    run = subprocess.run([sys.executable, "scripts/run_notebooks.py"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "executed").glob("*.ipynb")) == [p.name for p in NOTEBOOKS]
    book = subprocess.run(["bash", "scripts/build_book.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    out = book.stdout + book.stderr
    assert book.returncode == 0, out[-8000:]
    assert "arrive executed" in out, "the book should reuse nbval's executed notebooks, not run them again"
    html = ROOT / "book" / "_build" / "html"
    for nb in NOTEBOOKS:
        page = (html / "chapters" / f"{nb.stem}.html").read_text()
        assert "Traceback" not in page
    assert "js-plotly-plot" in (html / "chapters" / "01_prefill_vs_decode_roofline.html").read_text() or \
        "Plotly.newPlot" in (html / "chapters" / "01_prefill_vs_decode_roofline.html").read_text()
