// End-to-end batch-1 decode benchmark: tokens/s of the fast path on a checkpoint against its
// roofline (measured DRAM bandwidth / bytes of weights and KV read per decoded token).
#pragma once

#include <string>

#include "core/thread_pool.h"
#include "machine.h"
#include "model/deepseek.h"

namespace moeserve::bench {

struct E2eOptions {
  std::string model_dir;
  bool json = false;
  int prompt_tokens = 32;
  int decode_tokens = 32;
  WeightFormats formats;  // the requantized weights (the bytes per token counted as stored)
};

// Returns a process exit code.
// The model runs on a pool of its own with as many threads as `pool`.
int run_e2e_bench(const E2eOptions& options, const Ceilings& ceilings, const ThreadPool& pool);

}  // namespace moeserve::bench
