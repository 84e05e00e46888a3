#!/usr/bin/env bash
# Builds ik_llama.cpp (ikawrakow's fork of llama.cpp: IQK CPU GEMM and FlashAttention kernels, MLA
# for DeepSeek) for bench/peers/, beside build_llama_cpp.sh (issue 44). No registry carries its
# source, so the tree comes from a git mirror of github.com/ikawrakow/ik_llama.cpp that the caller
# provides (a bare mirror or a clone); the commit is pinned and exported with `git archive`.
# Blobs the mirror lacks (its largest files: the prebuilt web-UI index.html files and four
# ggml-vocab-*.gguf test vocabularies; none is used by the build, which embeds the .gz assets)
# are left out. Built with its own CMake and defaults (GGML_NATIVE: every instruction set this CPU
# has; IQK GEMM, IQK FlashAttention with all KV quant types; OpenMP), Release, only the tools the
# bench runs, no curl, no TLS. Idempotent; prints the bin directory.
#   bash bench/peers/build_ik_llama_cpp.sh GIT_DIR [DIR]      (default DIR build/peers)
# JOBS (default: ninja's default) caps the parallel compile jobs, e.g. JOBS=1 on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
git_dir=${1:?usage: build_ik_llama_cpp.sh GIT_DIR [DIR]}
dir=${2:-build/peers}
commit=8337e4cd3861406fc04e0854b1409cd1b027fbc9  # 2026-08-15 "Fix Qwen35+ MTP (#2322)"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
src="$dir/ik_llama.cpp-$commit"
if [ ! -f "$src/CMakeLists.txt" ]; then
  if [ -d "$git_dir/.git" ]; then git_dir="$git_dir/.git"; fi
  git --git-dir="$git_dir" cat-file -e "$commit^{commit}"
  # Paths whose blobs the mirror does not have (a bare mirror may omit its largest files).
  excludes=()
  while IFS= read -r -d '' entry; do
    meta=${entry%%$'\t'*}
    path=${entry#*$'\t'}
    sha=${meta##* }
    if ! git --git-dir="$git_dir" cat-file -e "$sha" 2>/dev/null; then
      echo "build_ik_llama_cpp: leaving out $path (blob absent from the mirror)" >&2
      excludes+=(":(exclude,literal)$path")
    fi
  done < <(git --git-dir="$git_dir" ls-tree -r -z "$commit")
  rm -rf "$src.tmp"
  mkdir -p "$src.tmp"
  # git 2.39 still prints "error: invalid object ... for '<path>'" for the first excluded path
  # and exits 0 with the rest of the tree.
  git --git-dir="$git_dir" archive "$commit" -- . "${excludes[@]}" | tar -x -C "$src.tmp"
  mv "$src.tmp" "$src"
fi
bin="$dir/ik_llama.cpp-build/bin"
tools=(llama-bench llama-server llama-quantize llama-perplexity)
built() { for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done; }
if ! built; then
  cmake -S "$src" -B "$dir/ik_llama.cpp-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DLLAMA_SERVER_SSL=OFF >&2
  cmake --build "$dir/ik_llama.cpp-build" ${JOBS:+-j "$JOBS"} --target "${tools[@]}" >&2
fi
echo "$bin"
