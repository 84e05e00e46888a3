#!/usr/bin/env bash
# Install, build, create the embedded default model (preset "tiny") and generate from it
# (the README's first command).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
[ -f models/tiny/config.json ] || ./build/moeserve make-model --preset tiny --out models/tiny
./build/moeserve generate --model models/tiny --prompt-ids 0,5,9 --max-tokens 16
