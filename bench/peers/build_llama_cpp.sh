#!/usr/bin/env bash
# Builds llama.cpp for bench/peers/ from its PyPI package (docs/peers.md): llama-cpp-python's
# sdist carries llama.cpp's whole tree (vendor/llama.cpp, commit 0c1e570 for 0.3.36), pinned here
# by version and SHA-256. Built with llama.cpp's own CMake and its defaults (GGML_NATIVE: every
# instruction set this CPU has, AMX included where present, OpenMP threads), Release, only the
# tools the bench runs; no TLS (nothing is fetched). Idempotent; prints the bin directory.
#   bash bench/peers/build_llama_cpp.sh [DIR]      (default build/peers)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build/peers}
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
sdist="$dir/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" \
    -d "$dir" >&2
fi
echo "$sha256  $sdist" | sha256sum -c --quiet - >&2
src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
[ -d "$src" ] || tar -xzf "$sdist" -C "$dir"
bin="$dir/llama.cpp-build/bin"
tools=(llama-bench llama-server llama-quantize llama-perplexity)
built() { for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done; }
if ! built; then
  cmake -S "$src" -B "$dir/llama.cpp-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF >&2
  cmake --build "$dir/llama.cpp-build" --target "${tools[@]}" >&2
fi
echo "$bin"
