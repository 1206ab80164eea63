"""`pytest --nbval-lax notebooks/` hooks: keep what nbval executed, so the book need not run it again.

With MINILLM_EXECUTED_NOTEBOOKS=<dir> set, every notebook whose cells all passed is
written to <dir> with the outputs nbval received from the kernel. scripts/build_book.sh
uses those copies instead of executing the notebooks a second time.
"""
from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

OUT = os.environ.get("MINILLM_EXECUTED_NOTEBOOKS")
_runs: dict[Path, dict] = {}


def pytest_runtest_makereport(item, call):
    if not OUT or call.when != "call" or not hasattr(item, "cell_num") or not hasattr(item.parent, "nb"):
        return None
    run = _runs.setdefault(Path(str(item.parent.fspath)), {"nb": item.parent.nb, "outputs": {}, "failed": False})
    run["outputs"][item.cell_num] = list(item.test_outputs or [])
    if call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
        run["failed"] = True
    return None


def _output(o: dict, count: int):
    kind = o.get("output_type")
    if kind == "stream":
        return nbformat.v4.new_output("stream", name=o["name"], text=o["text"])
    if kind == "execute_result":
        return nbformat.v4.new_output("execute_result", data=o["data"], metadata=o.get("metadata", {}),
                                      execution_count=count)
    if kind == "display_data":
        return nbformat.v4.new_output("display_data", data=o["data"], metadata=o.get("metadata", {}))
    if kind == "error":
        return nbformat.v4.new_output("error", ename=o["ename"], evalue=o["evalue"], traceback=o["traceback"])
    return None


def pytest_sessionfinish(session, exitstatus):
    if not OUT:
        return
    out = Path(OUT)
    out.mkdir(parents=True, exist_ok=True)
    for path, run in _runs.items():
        nb = nbformat.from_dict(run["nb"])
        code = [c for c in nb.cells if c.cell_type == "code"]
        if run["failed"] or len(run["outputs"]) != len(code):
            (out / path.name).unlink(missing_ok=True)  # a stale copy must not reach the book
            continue
        for k, cell in enumerate(code):
            cell.execution_count = k + 1
            cell.outputs = [o for o in (_output(x, k + 1) for x in run["outputs"][k]) if o is not None]
        nbformat.validate(nb)
        nbformat.write(nb, out / path.name)
