#!/usr/bin/env bash
# Set up, then run the demo: a batch of varied prompts through continuous batching on the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec minillm demo "$@"
