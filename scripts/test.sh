#!/usr/bin/env bash
# Install, build and run every test (the README's second command; .ci/run calls it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j2
