"""Execute the course notebooks under nbval in parallel lanes, each lane pinned to its own CPUs.

    python scripts/run_notebooks.py                    # every notebook, one lane per CPU (at most 2)
    python scripts/run_notebooks.py --lanes 1 notebooks/03_*.ipynb
    MINILLM_EXECUTED_NOTEBOOKS=DIR python scripts/run_notebooks.py   # keep the executed copies for the book

Why lanes: a notebook spends most of its time in one Python thread (the engine's scheduler, plotly,
the kernel round trips), so running them one after another on a 2-core machine leaves a core idle.
Each lane is a `pytest --nbval-lax` process per notebook, pinned with `sched_setaffinity` to a
disjoint share of the CPUs; torch and OpenMP then size their thread pools to that share, so the
lanes do not fight over cores and each notebook's measured claims compare runs made on the same
CPUs. Lanes take the notebooks longest-first from one queue (`SECONDS` holds their last measured
cost; an unknown notebook counts as long), so the slowest notebook starts at once.

Exit status: 0 when every notebook passed; otherwise 1, with each failing notebook's pytest output.
"""
from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Seconds each notebook took under nbval in a lane of one CPU, on a 2-core EPYC (Zen3, AVX2) on 2026-12-04
# (all 15 in two lanes: 1,090 s; one after another on both CPUs, stop 33: 2,314 s). Only the order matters:
# the long ones go first, so the lanes finish together.
SECONDS = {
    "00_quickstart": 86, "01_prefill_vs_decode_roofline": 76, "02_kv_cache_memory": 88,
    "03_paged_attention_block_tables": 146, "04_triton_kernels": 51, "05_continuous_vs_static_batching": 93,
    "06_prefix_caching": 85, "07_scheduling_knobs": 126, "08_quantization": 616,
    "09_speculative_decoding": 525, "10_tensor_parallelism": 49, "11_serving_metrics": 104,
    "12_priorities_and_the_tail": 69, "13_moe_routing": 18, "14_exercises": 36,
}
UNKNOWN_SECONDS = 10_000


@dataclass
class Result:
    notebook: Path
    lane: int
    seconds: float
    returncode: int
    output: str


def cpu_shares(lanes: int) -> list[set[int]]:
    """Split the CPUs this process may use into `lanes` disjoint, near-equal sets."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    lanes = max(1, min(lanes, len(cpus)))
    return [set(cpus[k::lanes]) for k in range(lanes)]


def nbval_command(notebook: Path, cell_timeout: int) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env",
            f"--nbval-cell-timeout={cell_timeout}", str(notebook)]


def run_lane(lane: int, cpus: set[int], todo: "queue.Queue[Path]", results: list[Result], cell_timeout: int,
             pinned: bool) -> None:
    def pin() -> None:  # runs in the child before exec: the kernel nbval starts inherits it
        if pinned:
            os.sched_setaffinity(0, cpus)

    while True:
        try:
            notebook = todo.get_nowait()
        except queue.Empty:
            return
        start = time.perf_counter()
        run = subprocess.run(nbval_command(notebook, cell_timeout), cwd=ROOT, capture_output=True, text=True,
                             preexec_fn=pin)
        seconds = time.perf_counter() - start
        results.append(Result(notebook, lane, seconds, run.returncode, run.stdout + run.stderr))
        print(f"lane {lane} (cpus {sorted(cpus)}): {notebook.name} {'passed' if run.returncode == 0 else 'FAILED'} "
              f"in {seconds:.0f} s", flush=True)


def run_notebooks(notebooks: list[Path], lanes: int, cell_timeout: int = 900) -> list[Result]:
    shares = cpu_shares(lanes)
    pinned = hasattr(os, "sched_setaffinity") and len(shares) > 1
    todo: "queue.Queue[Path]" = queue.Queue()
    for nb in sorted(notebooks, key=lambda p: -SECONDS.get(p.stem, UNKNOWN_SECONDS)):
        todo.put(nb)
    results: list[Result] = []
    threads = [threading.Thread(target=run_lane, args=(k, cpus, todo, results, cell_timeout, pinned))
               for k, cpus in enumerate(shares)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: r.notebook.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/[0-9][0-9]_*.ipynb")
    parser.add_argument("--lanes", type=int, default=int(os.environ.get("MINILLM_NOTEBOOK_LANES", "2")),
                        help="parallel lanes, at most one per CPU (default 2, or MINILLM_NOTEBOOK_LANES)")
    parser.add_argument("--cell-timeout", type=int, default=900)
    args = parser.parse_args(argv)
    notebooks = [p.resolve() for p in args.notebooks] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    start = time.perf_counter()
    results = run_notebooks(notebooks, args.lanes, args.cell_timeout)
    failed = [r for r in results if r.returncode != 0]
    for r in failed:
        print(f"\n===== {r.notebook.name} failed (lane {r.lane}) =====\n{r.output[-8000:]}", flush=True)
    print(f"{len(results) - len(failed)} of {len(results)} notebooks passed in {time.perf_counter() - start:.0f} s "
          f"({len(cpu_shares(args.lanes))} lanes)", flush=True)
    return 1 if failed or len(results) != len(notebooks) else 0


if __name__ == "__main__":
    sys.exit(main())
