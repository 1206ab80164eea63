"""The suite's own parallelism: pytest-xdist workers pinned to their CPUs (conftest.py) and the notebooks'
nbval lanes (scripts/run_notebooks.py): disjoint CPU shares, longest notebook first, failures reported."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import run_notebooks  # noqa: E402

sys.path.pop(0)

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")


@needs_affinity
@pytest.mark.parametrize("lanes", [1, 2, 3, 64])
def test_lane_cpu_shares_are_disjoint_and_cover_the_cpus(lanes):
    cpus = os.sched_getaffinity(0)
    shares = run_notebooks.cpu_shares(lanes)
    assert len(shares) == min(lanes, len(cpus))
    assert set().union(*shares) == cpus and sum(len(s) for s in shares) == len(cpus)
    assert max(len(s) for s in shares) - min(len(s) for s in shares) <= 1


@needs_affinity
def test_an_xdist_worker_is_pinned_to_its_own_share():
    """conftest.py, imported in a worker's environment, keeps only that worker's CPUs and sizes torch to them."""
    cpus = sorted(os.sched_getaffinity(0))
    code = ("import os, torch, tests.conftest; "
            "print(sorted(os.sched_getaffinity(0)), torch.get_num_threads())")
    for worker in range(2):
        env = dict(os.environ, PYTEST_XDIST_WORKER=f"gw{worker}", PYTEST_XDIST_WORKER_COUNT="2")
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        share = cpus[worker::2] or cpus  # one CPU: nothing to split, the worker keeps it
        assert out.stdout.rsplit(" ", 1) == [str(share), str(len(share)) + "\n"], out.stdout


def _notebook(path: Path, source: str) -> Path:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_the_lanes_report_each_notebook_and_fail_when_one_fails(tmp_path, capsys):
    pytest.importorskip("nbval")
    good = _notebook(tmp_path / "01_good.ipynb", "x = 1 + 1\nassert x == 2")
    bad = _notebook(tmp_path / "02_bad.ipynb", "assert 1 + 1 == 3, 'the claim failed'")
    assert run_notebooks.main([str(good), str(bad), "--lanes", "2"]) == 1
    out = capsys.readouterr().out
    assert "01_good.ipynb passed" in out and "02_bad.ipynb FAILED" in out
    assert "===== 02_bad.ipynb failed" in out and "the claim failed" in out
    assert "1 of 2 notebooks passed" in out
    assert run_notebooks.main([str(good), "--lanes", "2"]) == 0


def test_the_longest_notebook_starts_first(tmp_path, monkeypatch):
    started: list[str] = []
    monkeypatch.setattr(run_notebooks, "nbval_command", lambda nb, t: started.append(nb.stem) or ["true"])
    names = ["13_moe_routing", "08_quantization", "new_notebook", "02_kv_cache_memory"]
    run_notebooks.run_notebooks([tmp_path / f"{n}.ipynb" for n in names], lanes=1)
    assert started == ["new_notebook", "08_quantization", "02_kv_cache_memory", "13_moe_routing"]
