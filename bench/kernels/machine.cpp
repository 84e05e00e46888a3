#include "machine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "kernels/cpu_features.h"

namespace moeserve::bench {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t read_sum(const uint64_t* p, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  return s0 ^ s1 ^ s2 ^ s3;
}

// The largest cache of cpu0 in sysfs (index*/size, "32768K" or "480M"); 0 if none is listed.
double largest_cache_bytes() {
  double best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    double v = 0;
    std::string unit;
    if (!(f >> v)) continue;
    f >> unit;
    const double mult = unit.rfind('K', 0) == 0   ? 1024.0
                        : unit.rfind('M', 0) == 0 ? 1024.0 * 1024.0
                        : unit.rfind('G', 0) == 0 ? 1024.0 * 1024.0 * 1024.0
                                                  : 1.0;
    best = std::max(best, v * mult);
  }
  return best;
}

}  // namespace

double dram_stream_bytes() {
  static const double bytes = std::max(256.0 * (1 << 20), 2 * largest_cache_bytes());
  return bytes;
}

double measure_dram_read_gbps(ThreadPool& pool, int passes, double min_s) {
  // Twice dram_stream_bytes() (512 MiB at least), written once and kept for later readings.
  static const size_t bytes = size_t(2 * dram_stream_bytes()) / 64 * 64, words = bytes / 8;
  static uint64_t* const buf = [] {
    auto* b = static_cast<uint64_t*>(std::aligned_alloc(64, bytes));
    for (size_t i = 0; i < words; ++i) b[i] = i;
    return b;
  }();
  const int threads = pool.size();
  std::atomic<uint64_t> sink{0};
  double best = 0;
  const double t_start = now_s();
  for (int pass = 0; pass < passes || now_s() - t_start < min_s; ++pass) {
    double t0 = now_s();
    pool.parallel_for(threads, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        size_t w0 = words * size_t(t) / size_t(threads),
               w1 = words * size_t(t + 1) / size_t(threads);
        sink += read_sum(buf + w0, w1 - w0);
      }
    });
    best = std::max(best, double(bytes) / (now_s() - t0) / 1e9);
  }
  return best;
}

double Ceilings::gemm_peak_gflops() const {
  return active_isa() == Isa::kAmx && amx_bf16_peak_gflops > 0 ? amx_bf16_peak_gflops
                                                               : bf16_peak_gflops;
}

double Ceilings::int8_peak_gops() const {
  return active_isa() == Isa::kAmx && amx_int8_peak_gops > 0 ? amx_int8_peak_gops : vnni_peak_gops;
}

namespace {

// The best of 3 passes of loop(iters) on every thread at once, in G per second.
double peak_of(ThreadPool& pool, double (*loop)(long), long iters) {
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    std::atomic<double> flops{0};
    const double t0 = now_s();
    pool.parallel_for(pool.size(), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        double f = loop(iters);
        double cur = flops.load();
        while (!flops.compare_exchange_weak(cur, cur + f)) {
        }
      }
    });
    best = std::max(best, flops.load() / (now_s() - t0) / 1e9);
  }
  return best;
}

}  // namespace

double measure_amx_bf16_gflops(ThreadPool& pool) {
  return cpu_isa() == Isa::kAmx ? peak_of(pool, amx_bf16_loop, 500'000) : 0;
}

double measure_amx_int8_gops(ThreadPool& pool) {
  return cpu_isa() == Isa::kAmx ? peak_of(pool, amx_int8_loop, 500'000) : 0;
}

Ceilings measure_ceilings(ThreadPool& pool) {
  Ceilings c;
  c.dram_read_gbps = measure_dram_read_gbps(pool, 3);
  // Compute: ~0.2 s of register-only dot products per thread, best of 3.
  const bool bf16 = cpu_isa() >= Isa::kAvx512Bf16;
  const bool fma = isa_at_most(Isa::kAvx2, cpu_isa());
  if (!fma) return c;
  c.bf16_peak_gflops = bf16 ? peak_of(pool, dpbf16_loop, 50'000'000 / 16)
                            : peak_of(pool, fma_f32_loop, 50'000'000 / 12);
  if (bf16) c.vnni_peak_gops = peak_of(pool, dpbusd_loop, 50'000'000 / 16);
  if (cpu_isa() == Isa::kAmx) {  // 3 passes each: ~30 ms (BF16), ~0.1 s (INT8)
    c.amx_bf16_peak_gflops = measure_amx_bf16_gflops(pool);
    c.amx_int8_peak_gops = measure_amx_int8_gops(pool);
  }
  return c;
}

}  // namespace moeserve::bench
