// Benchmarks of the fast path's small ops (rmsnorm, RoPE, silu_mul) on one thread at the shapes
// a step of DeepSeek-V3 (hidden 7168, expert intermediate 2048, 128 heads) and of the bench
// preset (hidden 2048, 512, 16 heads) give them, decode (32 tokens) and prefill (1024 tokens).
// Each case prints the time per call, GB/s over the bytes read and written, the ratio to the
// machine's DRAM read bandwidth (above 1 where the operands stay in cache) and the speed-up over
// the scalar reference the reference path runs (the baseline).
#pragma once

#include "machine.h"

namespace moeserve::bench {

struct SmallOpsBenchOptions {
  bool json = false;
  bool quick = false;
};

void run_small_ops_benches(const SmallOpsBenchOptions& opt, const Ceilings& ceil);

}  // namespace moeserve::bench
