// The machine's ceilings, measured at the start of every bench run on the threads the kernels
// get: DRAM read bandwidth (a streaming read of a buffer far larger than the caches) and the
// BF16 dot-product peak (a vdpbf16ps register loop; an FP32 FMA loop counted as 2 flops per lane
// when the CPU has no AVX-512 BF16). Single-threaded callers only.
#pragma once

#include "core/thread_pool.h"

namespace moeserve::bench {

struct Ceilings {
  double dram_read_gbps = 0;
  double bf16_peak_gflops = 0;
};

Ceilings measure_ceilings(ThreadPool& pool);

// Register loops (machine_avx512.cpp, machine_avx2.cpp): flops done by `iters` iterations.
double dpbf16_loop(long iters);
double fma_f32_loop(long iters);

}  // namespace moeserve::bench
