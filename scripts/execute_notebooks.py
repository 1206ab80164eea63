#!/usr/bin/env python3
"""Execute notebooks with nbclient and write the executed copies; fail on the first cell error.

    python scripts/execute_notebooks.py OUT_DIR notebooks/*.ipynb

Each notebook runs with its own folder as the working directory (as nbval does).
Used by scripts/build_book.sh when no executed copies were handed to it.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def execute(src: Path, out_dir: Path, timeout: int) -> Path:
    nb = nbformat.read(src, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(src.parent.resolve())}})
    client.execute()
    out = out_dir / src.name
    nbformat.write(nb, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    a = ap.parse_args(argv)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for nb in a.notebooks:
        t0 = time.perf_counter()
        try:
            execute(nb, a.out_dir, a.timeout)
        except CellExecutionError as e:
            print(f"FAILED {nb}:\n{e}", file=sys.stderr)
            return 1
        print(f"executed {nb} in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
