// gemm_fp8 benchmark cases: DeepSeek-V3's projection shapes (dense) and routed-expert shapes
// (grouped) and the lm_head (gemm_bf16), timed against the measured ceilings and oneDNN's BF16
// matmul on the same shapes. Each case prints one line (JSON or a table row).
#pragma once

#include <string>

#include "core/thread_pool.h"
#include "machine.h"

namespace moeserve::bench {

struct GemmBenchOptions {
  bool json = false;
  bool quick = false;
  std::string only;  // run only the kernels whose name starts with this ("" = all)
};

void run_gemm_benches(const GemmBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool);

}  // namespace moeserve::bench
