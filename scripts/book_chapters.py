#!/usr/bin/env python3
"""Prepare executed notebooks to be book chapters (in place): keep what a static page can show.

    python scripts/book_chapters.py book/chapters/*.ipynb

- plotly figures carry their JSON spec (for JupyterLab) and a text/html twin (for the book,
  drawn by the plotly.js the book ships in _static): drop the JSON;
- live widgets need a kernel: drop the widget view; their text/html note remains;
- an error output means the notebook did not run cleanly: refuse to build.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

DROP = ("application/vnd.plotly.v1+json", "application/vnd.jupyter.widget-view+json")


def prepare(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            if out.output_type == "error":
                raise SystemExit(f"{path}: a cell raised {out.ename}: {out.evalue}")
            for mime in DROP:
                if mime in out.get("data", {}) and len(out["data"]) > 1:
                    del out["data"][mime]
    nbformat.write(nb, path)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        prepare(Path(p))
