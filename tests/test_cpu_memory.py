"""minillm/cpu/memory.py: an engine on a CPU keeps freed memory for its next step (glibc's thresholds).

Each case runs in a fresh process: the settings are process-wide and set once."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = """
import sys, torch
sys.path.insert(0, {root!r})
from minillm.cpu import memory as cpu_memory
from minillm.roofline.machine import cpu_kernels
before = cpu_memory.malloc_state()
from tests.helpers.engine_utils import make_engine, tiny_model
make_engine(tiny_model())
print(before, "|", cpu_memory.malloc_state(), "|", cpu_kernels()["malloc"])
"""


def run_child(**env) -> list[str]:
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=ROOT)], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return [p.strip() for p in out.stdout.strip().splitlines()[-1].split("|")]


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_an_engine_on_a_cpu_raises_glibcs_thresholds_and_the_bench_records_it():
    before, after, recorded = run_child()
    assert before == "None"  # nothing happens until an engine starts
    assert after.startswith("glibc: mmap threshold 256 MiB") and recorded == after


def test_the_setting_can_be_left_alone():
    before, after, recorded = run_child(MINILLM_MALLOC="system")
    assert after.startswith("system") and recorded == after
