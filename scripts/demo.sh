#!/usr/bin/env bash
# Set up, then run the demo: a batch of varied prompts through continuous batching on the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "demo.sh: setting up first (pip, quiet; a fresh machine downloads torch, which takes a while)" >&2
bash scripts/install.sh
echo "demo.sh: running minillm demo" >&2
exec minillm demo "$@"
