#!/usr/bin/env bash
# Install, build (which lays out the embedded default model, assets/models/tiny-py, in
# build/models/tiny-py) and complete the start of a Python function with it (the README's first
# command).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
./build/moeserve generate --model build/models/tiny-py --prompt $'def fibonacci(n):\n' --max-tokens 60
