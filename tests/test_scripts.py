"""scripts/test.sh installs what its tests need and says what it skips; run with stand-ins for python3 and apt-get.

A fake `python3` records every call (pip installs, pytest) and a fake `apt-get` records the Chromium
install, on a PATH without Chromium. What can fail: Chromium must be installed when we are root, pytest
must list skip reasons (-rs), and the quick mode must run the fast subset without models or Chromium.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDER = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n'


@pytest.fixture()
def fake_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "basename", "id", "sh"):
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"no {tool} on this machine")
        (bin_dir / tool).symlink_to(found)
    for fake in ("python3", "apt-get"):
        (bin_dir / fake).write_text(RECORDER)
        (bin_dir / fake).chmod(0o755)
    return bin_dir


def run_test_sh(bin_dir: Path, tmp_path: Path, args: tuple[str, ...] = ("-k", "x"), **env: str) -> tuple[list[str], str]:
    calls = tmp_path / "calls.txt"
    run_env = {"PATH": str(bin_dir), "CALLS": str(calls), "HOME": str(tmp_path), **env}
    proc = subprocess.run([str(bin_dir / "bash"), str(ROOT / "scripts" / "test.sh"), *args], env=run_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return calls.read_text().splitlines(), proc.stderr


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="the Chromium install path needs root")
def test_test_sh_installs_chromium_and_lists_skip_reasons(fake_path, tmp_path):
    calls, err = run_test_sh(fake_path, tmp_path, MINILLM_TEST_MODELS="0")
    assert any(c.startswith("apt-get install") and "chromium" in c for c in calls), calls
    pytest_call = next(c for c in calls if c.startswith("python3 -m pytest"))
    assert " -rs " in pytest_call and pytest_call.endswith("-k x") and "not slow" not in pytest_call
    assert any("pip install -q -e .[test,server,notebooks]" in c for c in calls)
    assert "installing Chromium" in err and "install.sh: torch" in err  # no silent minutes


def test_quick_mode_runs_the_fast_subset_without_models_or_chromium(fake_path, tmp_path):
    calls, _ = run_test_sh(fake_path, tmp_path, MINILLM_QUICK="1")
    assert not any(c.startswith("apt-get") for c in calls)
    assert not any("models" in c for c in calls if "pip" in c)
    pytest_call = next(c for c in calls if c.startswith("python3 -m pytest"))
    assert "-rs -m not slow -k x" in pytest_call


def test_the_whole_suite_runs_in_two_phases_with_a_worker_per_cpu(fake_path, tmp_path):
    """Phase 1: every test but the notebooks' run, in pytest-xdist workers (one per CPU, whole files each),
    then the equivalence tests again on the plain path (MINILLM_FAST_PATH=off); phase 2: the notebooks' run
    alone, so its timed claims do not share the CPUs with other tests."""
    # a python3 that reports 2 usable CPUs (and, as a recorder, that xdist imports)
    (fake_path / "python3").write_text(RECORDER + 'case "$2" in *sched_getaffinity*) echo 2;; esac\n')
    calls, err = run_test_sh(fake_path, tmp_path, args=(), MINILLM_TEST_MODELS="0")
    runs = [c for c in calls if c.startswith("python3 -m pytest")]
    notebooks = "tests/test_notebooks.py::test_notebooks_execute_under_nbval_and_the_book_builds"
    assert len(runs) == 3, runs
    assert "-n 2 --dist loadfile" in runs[0] and runs[0].endswith(f"--deselect {notebooks}"), runs[0]
    assert "tests/test_engine_equivalence.py" in runs[1] and "-n 2" in runs[1], runs[1]
    assert runs[2].endswith(notebooks) and " -n " not in runs[2] and " -rs " in runs[2], runs[2]
    assert "phase 1 of 2" in err and "MINILLM_FAST_PATH=off" in err and "phase 2 of 2" in err


def test_one_worker_when_asked(fake_path, tmp_path):
    (fake_path / "python3").write_text(RECORDER + 'case "$2" in *sched_getaffinity*) echo 2;; esac\n')
    calls, _ = run_test_sh(fake_path, tmp_path, args=(), MINILLM_TEST_MODELS="0", MINILLM_TEST_WORKERS="1")
    runs = [c for c in calls if c.startswith("python3 -m pytest")]
    assert len(runs) == 3 and not any(" -n " in r for r in runs), runs
