// gemm_fp8 benchmark cases: DeepSeek-V3's projection shapes (dense) and routed-expert shapes
// (grouped), timed against the measured ceilings and oneDNN's BF16 matmul on the same shapes.
// Each case prints one line (JSON or a table row).
#pragma once

#include "core/thread_pool.h"
#include "machine.h"

namespace moeserve::bench {

struct GemmBenchOptions {
  bool json = false;
  bool quick = false;
};

void run_gemm_benches(const GemmBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool);

}  // namespace moeserve::bench
