// mla_decode benchmark cases: DeepSeek-V3's MLA shape (kv_lora_rank 512 + rope 64, BF16 cache)
// at batch 1/8/32 x context 1k/4k/16k x 16/128 heads, each decode case again on the same values
// in FlashMLA's FP8 cache format (its baseline: the BF16 cache's time), plus causal prefill
// chunks. The caches
// rotate among copies totalling well over the L3, so every timed call reads DRAM. Each case
// prints one line (JSON or a table row) with ratios to the machine's roofline (DRAM bandwidth
// over the latent cache, BF16 peak over the attention FLOPs) and to a baseline: no oneDNN
// equivalent exists, so the baseline is a straightforward per-head AVX-512 implementation that
// reads the cache once per head (bench_mla.cpp).
#pragma once

#include "core/thread_pool.h"
#include "machine.h"

namespace moeserve::bench {

struct MlaBenchOptions {
  bool json = false;
  bool quick = false;
};

void run_mla_benches(const MlaBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool);

}  // namespace moeserve::bench
