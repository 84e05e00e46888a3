// DeepSeek-V4's fast path at V4-Flash's per-layer widths (make-model --preset v4-flash-bench:
// 4 layers, sliding / CSA / HCA / CSA, 16 FP4 experts top 6), docs/deepseek-v4.md "Bench": batch-1
// decode TPOT at long contexts (a KV cache of the context's blocks, every block a copy of one the
// model wrote, so the step reads real entries at the real sizes) and prefill time, each against
// its roofline: the bytes the step must read at the measured DRAM bandwidth, or its GEMM flops at
// the BF16 peak plus its attention and indexer flops at the F32 FMA peak, whichever is longer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "machine.h"
#include "model/causal_lm.h"

namespace moeserve::bench {

struct V4BenchOptions {
  std::string model_dir;
  bool json = false;
  std::vector<int64_t> contexts = {4096, 65536, 262144, 1048576};  // decode
  std::vector<int64_t> prefill = {8192};
  std::vector<int64_t> batches = {32};  // batched decode, at batch_context each
  int64_t batch_context = 4096;
  int repeats = 3;
  WeightFormats formats;  // the requantizing options (--projection-dtype, ...)
};

// Returns a process exit code. The model runs on a pool of its own with as many threads as `pool`.
int run_v4_bench(const V4BenchOptions& options, const Ceilings& ceilings, const ThreadPool& pool);

}  // namespace moeserve::bench
