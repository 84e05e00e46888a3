// The machine's ceilings, measured at the start of every bench run on the threads the kernels
// get: DRAM read bandwidth (a streaming read of a buffer far larger than the caches) and the
// BF16 dot-product peak (a vdpbf16ps register loop; an FP32 FMA loop counted as 2 flops per lane
// when the CPU has no AVX-512 BF16), the VNNI INT8 dot-product peak (vpdpbusd) where the CPU has
// it, and on AMX CPUs the tile unit's BF16 and INT8 peaks (TDPBF16PS / TDPBSSD loops on tiles
// that never leave the unit). Single-threaded callers only.
#pragma once

#include "core/thread_pool.h"

namespace moeserve::bench {

struct Ceilings {
  double dram_read_gbps = 0;
  double bf16_peak_gflops = 0;
  double amx_bf16_peak_gflops = 0;  // 0 without AMX
  double amx_int8_peak_gops = 0;
  double vnni_peak_gops = 0;  // 0 below the AVX-512 BF16 level

  // The compute ceiling of a kernel running at the active ISA level: the AMX BF16 peak where
  // the GEMMs run on tiles, else the vector dot-product peak.
  double gemm_peak_gflops() const;
  // The same for gemm_int8: the AMX INT8 peak, else the VNNI one (G int ops per second).
  double int8_peak_gops() const;
};

Ceilings measure_ceilings(ThreadPool& pool);

// Bytes a bench must stream through for its reads to come from DRAM: twice the last-level cache
// the OS reports (sysfs; some Xeon VMs here report 480 MiB of L3), and at least 256 MiB (8x a
// 32 MiB L3). The DRAM reading and the memory-bound kernel cases rotate through this much.
double dram_stream_bytes();

// DRAM read bandwidth alone: the best of at least `passes` passes (~20 ms each) and of as many
// as fit in `min_s` seconds. The reading of the VM these benches were written on drifts by up to
// 2x within minutes and swings within a second, so a memory-bound case is held to a reading
// taken around its own timing, with the same statistic (best of as long as the case was timed):
// local_ceilings.
double measure_dram_read_gbps(ThreadPool& pool, int passes, double min_s = 0);

// The AMX BF16 peak alone (0 without AMX): the best of 3 passes of ~30 ms. The tile unit of the
// Xeon VM the AMX kernels were written on ran anywhere from 0.3x to 1x of its best within
// minutes (a neighbour on the same core, we think), so AMX cases are held to a reading taken
// right after them.
double measure_amx_bf16_gflops(ThreadPool& pool);
// The AMX INT8 peak alone (0 without AMX), the same way.
double measure_amx_int8_gops(ThreadPool& pool);

// `start` with the DRAM reading replaced by the better of `before` and one taken now, each the
// best over `min_s`, and the AMX BF16 and INT8 peaks by readings taken now.
inline Ceilings local_ceilings(const Ceilings& start, double before, ThreadPool& pool,
                               double min_s) {
  Ceilings c = start;
  const double after = measure_dram_read_gbps(pool, 1, min_s);
  c.dram_read_gbps = before > after ? before : after;
  if (c.amx_bf16_peak_gflops > 0) c.amx_bf16_peak_gflops = measure_amx_bf16_gflops(pool);
  if (c.amx_int8_peak_gops > 0) c.amx_int8_peak_gops = measure_amx_int8_gops(pool);
  return c;
}

// Register loops (machine_avx512.cpp, machine_avx2.cpp): flops done by `iters` iterations.
double dpbf16_loop(long iters);
double fma_f32_loop(long iters);
double amx_bf16_loop(long iters);  // machine_amx.cpp
double amx_int8_loop(long iters);
double dpbusd_loop(long iters);  // machine_avx512.cpp

}  // namespace moeserve::bench
