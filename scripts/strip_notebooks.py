#!/usr/bin/env python3
"""Strip notebooks for committing: no outputs, no execution counts, no widget state.

    python scripts/strip_notebooks.py notebooks/*.ipynb          # rewrite in place
    python scripts/strip_notebooks.py --check notebooks/*.ipynb  # exit 1 if any needs stripping

Exception: a cell whose source contains `# NBVAL_CHECK_OUTPUT` keeps its plain-text
outputs (small and deterministic by design): they are what nbval compares. To refresh them,
execute the notebook (e.g. scripts/execute_notebooks.py) and strip it with --keep-checked-from.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

CHECK_MARK = "NBVAL_CHECK_OUTPUT"
TEXT_ONLY = ("text/plain",)
CELL_METADATA_DROP = ("execution", "collapsed", "scrolled", "ExecuteTime")


def _text_outputs(outputs: list) -> list:
    kept = []
    for o in outputs:
        if o.get("output_type") == "stream":
            kept.append(nbformat.v4.new_output("stream", name=o["name"], text=o["text"]))
        elif o.get("output_type") == "execute_result":
            data = {k: v for k, v in o.get("data", {}).items() if k in TEXT_ONLY}
            if data:
                kept.append(nbformat.v4.new_output("execute_result", data=data, execution_count=1))
    return kept


def strip(nb, executed=None):
    """Return a stripped copy of nb; checked cells take their outputs from `executed` when given."""
    nb = nbformat.from_dict(nb)
    nb.metadata.pop("widgets", None)
    ran = {c.get("id"): c for c in (executed.cells if executed is not None else [])}
    for k, cell in enumerate(nb.cells):
        for key in CELL_METADATA_DROP:
            cell.metadata.pop(key, None)
        if cell.cell_type != "code":
            continue
        if CHECK_MARK in cell.source:
            src = ran.get(cell.get("id"), cell)
            cell.outputs = _text_outputs(src.get("outputs", []))
            # nbval only compares cells that were run: keep a count on checked cells
            cell.execution_count = 1 if cell.outputs else None
            for o in cell.outputs:
                if o.output_type == "execute_result":
                    o.execution_count = cell.execution_count
        else:
            cell.outputs = []
            cell.execution_count = None
    return nb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--check", action="store_true", help="only report notebooks that are not stripped")
    ap.add_argument("--keep-checked-from", type=Path, default=None,
                    help="a folder of executed copies: checked cells take their outputs from there")
    a = ap.parse_args(argv)
    dirty = []
    for path in a.notebooks:
        nb = nbformat.read(path, as_version=4)
        executed = None
        if a.keep_checked_from is not None and (a.keep_checked_from / path.name).exists():
            executed = nbformat.read(a.keep_checked_from / path.name, as_version=4)
        clean = strip(nb, executed)
        if nbformat.writes(clean) != nbformat.writes(nb):
            dirty.append(path)
            if not a.check:
                nbformat.write(clean, path)
    for path in dirty:
        print(f"{'not stripped' if a.check else 'stripped'}: {path}")
    return 1 if (a.check and dirty) else 0


if __name__ == "__main__":
    sys.exit(main())
