#!/usr/bin/env bash
# Set up, then run the whole test suite (CPU; Triton kernels run under TRITON_INTERPRET=1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test,server,notebooks
exec python3 -m pytest -q -p no:cacheprovider "$@"
