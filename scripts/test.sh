#!/usr/bin/env bash
# Install, build and run every test (the README's second command; .ci/run calls it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j2
# The checkpoint and safetensors loaders again under AddressSanitizer + UBSan: every malformed
# file must give an error, never a memory error.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOESERVE_ASAN=ON \
  -DMOESERVE_BENCH=OFF > /dev/null
cmake --build build-asan --target model_test
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ./build-asan/tests/model_test \
  --gtest_filter='Safetensors*:CheckpointTest.*:ModelConfig.*'
