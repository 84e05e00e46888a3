#include "gemm_bench.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_fp4.h"
#include "kernels/gemm_fp8.h"
#include "kernels/gemm_fp8_f32x.h"
#include "kernels/gemm_int4.h"
#include "kernels/gemm_int8.h"
#include "onednn_matmul.h"

namespace moeserve::bench {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

// Random FP8 weights [n, k] (no NaN bytes) and scales, packed.
PackedFp8Weight random_fp8(int64_t n, int64_t k, Rng& rng) {
  std::vector<uint8_t> w(size_t(n * k));
  for (size_t i = 0; i < w.size(); i += 8) {
    uint64_t r = rng.next();
    for (size_t j = 0; j < 8 && i + j < w.size(); ++j) {
      uint8_t b = uint8_t(r >> (8 * j));
      w[i + j] = (b & 0x7f) == 0x7f ? uint8_t(b ^ 1) : b;
    }
  }
  std::vector<float> s(size_t(((n + 127) / 128) * ((k + 127) / 128)));
  for (auto& v : s) v = 1e-3f * float(1 + rng.next() % 7);
  return pack_fp8_weight(w.data(), s.data(), n, k);
}

std::vector<uint16_t> random_bf16(size_t count, Rng& rng) {
  std::vector<uint16_t> v(count);
  for (auto& x : v) x = f32_to_bf16(float(int(rng.next() % 2001) - 1000) / 512.0f + 0.01f);
  return v;
}

std::vector<float> random_f32(size_t count, Rng& rng) {
  std::vector<float> v(count);
  for (auto& x : v) x = float(int64_t(rng.next() % 2000001) - 1000000) / 524288.0f + 0.01f;
  return v;
}

// Row counts at which the F32-activation variants are timed next to the BF16 ones.
bool f32x_case(int64_t m) {
  return m == 1 || m == 4 || m == 64 || m == 256 || m == 1024;
}

// Seconds per call of fn(copy): the best batch (one pass over all copies, so every call reads
// its weights from DRAM) after one untimed call. The best batch, not the mean, because the
// machine may be shared: the ceilings are measured the same way (best of passes).
double time_calls(const std::function<void(int)>& fn, int copies, double min_s) {
  fn(copies - 1);
  double best = 1e30, t_start = now_s();
  int batches = 0;
  while (batches < 3 || now_s() - t_start < min_s) {
    double t0 = now_s();
    for (int i = 0; i < copies; ++i) fn(i);
    best = std::min(best, (now_s() - t0) / copies);
    ++batches;
  }
  return best;
}

int copies_for(double bytes) {
  return std::max(2, int(std::ceil(dram_stream_bytes() / bytes)));
}

struct Case {
  const char* kernel;
  int64_t m, n, k, experts;  // experts 0: dense
  const char* layout;        // "dense" | "masked" | "contiguous"
  const char* act;           // activations: "bf16" (gemm_fp8*) | "f32" (gemm_fp8_f32x*)
};

bool is_int8(const Case& c) {
  return std::string(c.kernel).rfind("gemm_int8", 0) == 0;
}
bool is_int4(const Case& c) {
  return std::string(c.kernel).rfind("gemm_int4", 0) == 0;
}
bool is_fp4(const Case& c) {
  return std::string(c.kernel).rfind("gemm_fp4", 0) == 0;
}

// t_bf16: for the F32-activation variants and gemm_int8, the time of the FP8 kernel with BF16
// activations on the same case (0: none).
void report(const GemmBenchOptions& opt, const Ceilings& ceil, const Case& c, double t,
            double t_base, double t_bf16 = 0) {
  const int64_t e = std::max<int64_t>(1, c.experts);
  const bool bf16_weights = std::string(c.kernel) == "gemm_bf16";
  // INT8: one byte per weight and an F32 scale per column and 128-wide K block; INT4: half a
  // byte and two F32 (scale, minimum) per column and block; FP4: half a byte and one exponent
  // byte per column and 32-wide sub-block (4 per block).
  const double col_blocks = double((c.n + 63) / 64 * 64) * double((c.k + 127) / 128);
  const double scale_bytes = is_int8(c) || is_fp4(c) ? 4.0 * col_blocks
                             : is_int4(c)
                                 ? 8.0 * col_blocks
                                 : 4.0 * double((c.n + 127) / 128) * double((c.k + 127) / 128);
  const double per_weight = is_int4(c) || is_fp4(c) ? 0.5 : 1.0;
  const double wbytes = bf16_weights
                            ? 2.0 * double(c.n) * double(c.k)
                            : double(e) * (per_weight * double(c.n) * double(c.k) + scale_bytes);
  const double flops = 2.0 * double(c.m) * double(c.n) * double(c.k);
  const double peak = is_int8(c) || is_int4(c) ? ceil.int8_peak_gops() : ceil.gemm_peak_gflops();
  const double t_roof = std::max(wbytes / (ceil.dram_read_gbps * 1e9), flops / (peak * 1e9));
  const bool memory_bound = wbytes / (ceil.dram_read_gbps * 1e9) >= flops / (peak * 1e9);
  const double gbps = wbytes / t / 1e9, gflops = flops / t / 1e9;
  if (opt.json) {
    nlohmann::ordered_json j = {{"kernel", c.kernel},
                                {"m", c.m},
                                {"n", c.n},
                                {"act", c.act},
                                {"k", c.k},
                                {"gbps", gbps},
                                {"gflops", gflops},
                                {"ceiling_ratio", t_roof / t},
                                {"baseline_ratio", t_base / t},
                                {"bound", memory_bound ? "memory" : "compute"},
                                {"seconds", t},
                                {"baseline_seconds", t_base},
                                {"dram_read_gbps", ceil.dram_read_gbps},
                                {"bf16_peak_gflops", ceil.bf16_peak_gflops},
                                {"peak_gflops", peak},  // the compute ceiling used
                                {"isa", isa_name(active_isa())}};
    if (c.experts > 0) {
      j["experts"] = c.experts;
      j["layout"] = c.layout;
    }
    if (t_bf16 > 0) j["bf16_ratio"] = t_bf16 / t;  // > 1: faster than the BF16 variant
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print(
        "{:<22} {:>5} {:>6} {:>6} {:>3} {:<10} {:<4} {:>8.1f} {:>8.1f} {:>6.2f} {:>6.2f} {:>7}  "
        "{:<7} {:>5.1f}\n",
        c.kernel, c.m, c.n, c.k, c.experts, c.layout, c.act, gbps, gflops, t_roof / t, t_base / t,
        t_bf16 > 0 ? fmt::format("{:.2f}", t_bf16 / t) : std::string("-"),
        memory_bound ? "memory" : "compute", ceil.dram_read_gbps);
  }
  std::fflush(stdout);
}

// Whether the cases of `kernel` run (--only is a prefix of the kernel names).
bool wanted(const GemmBenchOptions& opt, const char* kernel) {
  return std::string(kernel).rfind(opt.only, 0) == 0;
}

// The FP8 weights requantized for gemm_int8 (what --gemm-int8 does at load), when its cases run.
std::vector<PackedInt8Weight> int8_copies(const GemmBenchOptions& opt,
                                          const std::vector<PackedFp8Weight>& w, ThreadPool& pool) {
  if (!wanted(opt, "gemm_int8") && !wanted(opt, "gemm_int8_grouped")) return {};
  std::vector<PackedInt8Weight> out(w.size());
  pool.parallel_for(int64_t(w.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[size_t(i)] = pack_int8_weight(w[size_t(i)]);
  });
  return out;
}

// The same for gemm_int4 (what --expert-dtype int4 does to the routed experts at load).
std::vector<PackedInt4Weight> int4_copies(const GemmBenchOptions& opt,
                                          const std::vector<PackedFp8Weight>& w, ThreadPool& pool) {
  if (!wanted(opt, "gemm_int4_grouped")) return {};
  std::vector<PackedInt4Weight> out(w.size());
  pool.parallel_for(int64_t(w.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[size_t(i)] = pack_int4_weight(w[size_t(i)]);
  });
  return out;
}

void run_dense(const GemmBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool, int64_t n,
               int64_t k, const std::vector<int64_t>& ms, Rng& rng) {
  const double min_s = opt.quick ? 0.15 : 0.4;
  const int copies = copies_for(double(n) * double(k));
  std::vector<PackedFp8Weight> w;
  for (int i = 0; i < copies; ++i) w.push_back(random_fp8(n, k, rng));
  const std::vector<PackedInt8Weight> w8 = int8_copies(opt, w, pool);
  std::vector<uint16_t> wb = random_bf16(size_t(n * k), rng);  // baseline weights
  const int base_copies = copies_for(2.0 * double(n) * double(k));
  for (int64_t m : ms) {
    std::vector<uint16_t> x = random_bf16(size_t(m * k), rng);
    std::vector<float> y(size_t(m * n));
    const double dram_before = measure_dram_read_gbps(pool, 1, min_s);
    double t = time_calls(
        [&](int i) {
          gemm_fp8(x.data(), m, k, w[size_t(i)], GemmOutput{y.data(), DType::kF32, n}, &pool);
        },
        copies, min_s);
    const Ceilings here = local_ceilings(ceil, dram_before, pool, min_s);
    OneDnnMatmul base(m, n, k);
    for (int i = 0; i < base_copies; ++i) base.add_weight(wb.data());
    double tb = time_calls([&](int i) { base.run(i, x.data(), y.data()); }, base_copies, min_s);
    if (wanted(opt, "gemm_fp8"))
      report(opt, here, Case{"gemm_fp8", m, n, k, 0, "dense", "bf16"}, t, tb);
    if (!w8.empty()) {
      const double dram8 = measure_dram_read_gbps(pool, 1, min_s);
      const double t8 = time_calls(
          [&](int i) {
            gemm_int8(x.data(), m, k, w8[size_t(i)], GemmOutput{y.data(), DType::kF32, n}, &pool);
          },
          copies, min_s);
      report(opt, local_ceilings(ceil, dram8, pool, min_s),
             Case{"gemm_int8", m, n, k, 0, "dense", "bf16"}, t8, tb, t);
    }
    if (!f32x_case(m) || !wanted(opt, "gemm_fp8")) continue;
    std::vector<float> x32 = random_f32(size_t(m * k), rng);
    const double dram_before32 = measure_dram_read_gbps(pool, 1, min_s);
    double t32 = time_calls(
        [&](int i) {
          gemm_fp8_f32x(x32.data(), m, k, w[size_t(i)], GemmOutput{y.data(), DType::kF32, n},
                        &pool);
        },
        copies, min_s);
    report(opt, local_ceilings(ceil, dram_before32, pool, min_s),
           Case{"gemm_fp8_f32x", m, n, k, 0, "dense", "f32"}, t32, tb, t);
  }
}

// Experts of [n, k]; rows split evenly (masked: capacity = rows per expert).
void run_grouped(const GemmBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool, int64_t n,
                 int64_t k, int64_t experts, const std::vector<int64_t>& ms, Rng& rng) {
  const double min_s = opt.quick ? 0.15 : 0.4;
  const int sets = copies_for(double(experts) * double(n) * double(k));
  std::vector<PackedFp8Weight> w;
  for (int i = 0; i < sets * experts; ++i) w.push_back(random_fp8(n, k, rng));
  std::vector<const PackedFp8Weight*> ptrs;
  for (auto& p : w) ptrs.push_back(&p);
  const std::vector<PackedInt8Weight> w8 = int8_copies(opt, w, pool);
  std::vector<const PackedInt8Weight*> ptrs8;
  for (auto& p : w8) ptrs8.push_back(&p);
  const std::vector<PackedInt4Weight> w4 = int4_copies(opt, w, pool);
  std::vector<const PackedInt4Weight*> ptrs4;
  for (auto& p : w4) ptrs4.push_back(&p);
  std::vector<uint16_t> wb = random_bf16(size_t(n * k), rng);
  const int base_sets = copies_for(2.0 * double(experts) * double(n) * double(k));
  for (int64_t m : ms) {
    const int64_t rows = m / experts;  // per expert
    const bool masked = rows <= 8;
    std::vector<uint16_t> x = random_bf16(size_t(m * k), rng);
    std::vector<float> y(size_t(m * n));
    std::vector<int64_t> off(size_t(experts + 1));
    for (int64_t e = 0; e <= experts; ++e) off[size_t(e)] = e * rows;
    std::vector<int32_t> counts(static_cast<size_t>(experts), static_cast<int32_t>(rows));
    GemmOutput out{y.data(), DType::kF32, n};
    const double dram_before = measure_dram_read_gbps(pool, 1, min_s);
    double t = time_calls(
        [&](int i) {
          const PackedFp8Weight* const* set = ptrs.data() + i * experts;
          if (masked) {
            gemm_fp8_grouped_masked(x.data(), k, rows, counts.data(), set, experts, out, &pool);
          } else {
            gemm_fp8_grouped_contiguous(x.data(), k, off.data(), set, experts, out, &pool);
          }
        },
        sets, min_s);
    const Ceilings here = local_ceilings(ceil, dram_before, pool, min_s);
    // Baseline: one oneDNN matmul per expert on its rows.
    OneDnnMatmul base(rows, n, k);
    for (int i = 0; i < base_sets * experts; ++i) base.add_weight(wb.data());
    double tb = time_calls(
        [&](int i) {
          for (int64_t e = 0; e < experts; ++e)
            base.run(int(i * experts + e), x.data() + e * rows * k, y.data() + e * rows * n);
        },
        base_sets, min_s);
    const char* layout = masked ? "masked" : "contiguous";
    if (wanted(opt, "gemm_fp8_grouped"))
      report(opt, here, Case{"gemm_fp8_grouped", m, n, k, experts, layout, "bf16"}, t, tb);
    if (!w8.empty()) {
      const double dram8 = measure_dram_read_gbps(pool, 1, min_s);
      const double t8 = time_calls(
          [&](int i) {
            const PackedInt8Weight* const* set = ptrs8.data() + i * experts;
            if (masked) {
              gemm_int8_grouped_masked(x.data(), k, rows, counts.data(), set, experts, out, &pool);
            } else {
              gemm_int8_grouped_contiguous(x.data(), k, off.data(), set, experts, out, &pool);
            }
          },
          sets, min_s);
      report(opt, local_ceilings(ceil, dram8, pool, min_s),
             Case{"gemm_int8_grouped", m, n, k, experts, layout, "bf16"}, t8, tb, t);
    }
    if (!w4.empty()) {
      const double dram4 = measure_dram_read_gbps(pool, 1, min_s);
      const double t4 = time_calls(
          [&](int i) {
            const PackedInt4Weight* const* set = ptrs4.data() + i * experts;
            if (masked) {
              gemm_int4_grouped_masked(x.data(), k, rows, counts.data(), set, experts, out, &pool);
            } else {
              gemm_int4_grouped_contiguous(x.data(), k, off.data(), set, experts, out, &pool);
            }
          },
          sets, min_s);
      report(opt, local_ceilings(ceil, dram4, pool, min_s),
             Case{"gemm_int4_grouped", m, n, k, experts, layout, "bf16"}, t4, tb, t);
    }
    if (!wanted(opt, "gemm_fp8_grouped")) continue;
    std::vector<float> x32 = random_f32(size_t(m * k), rng);
    const double dram_before32 = measure_dram_read_gbps(pool, 1, min_s);
    double t32 = time_calls(
        [&](int i) {
          const PackedFp8Weight* const* set = ptrs.data() + i * experts;
          if (masked) {
            gemm_fp8_f32x_grouped_masked(x32.data(), k, rows, counts.data(), set, experts, out,
                                         &pool);
          } else {
            gemm_fp8_f32x_grouped_contiguous(x32.data(), k, off.data(), set, experts, out, &pool);
          }
        },
        sets, min_s);
    report(opt, local_ceilings(ceil, dram_before32, pool, min_s),
           Case{"gemm_fp8_f32x_grouped", m, n, k, experts, layout, "f32"}, t32, tb, t);
  }
}

// DeepSeek-V4's routed experts as the checkpoint holds them (FP4, gemm_fp4): random codes and
// exponents near 2^-7, rows split evenly as run_grouped; the baseline is its oneDNN BF16 matmul
// per expert, and vs_bf16 is gemm_int8's time on the same shapes over gemm_fp4's (twice the
// bytes).
void run_grouped_fp4(const GemmBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool, int64_t n,
                     int64_t k, int64_t experts, const std::vector<int64_t>& ms, Rng& rng) {
  const double min_s = opt.quick ? 0.15 : 0.4;
  const int sets = copies_for(0.53 * double(experts) * double(n) * double(k));
  std::vector<uint8_t> codes(size_t(n * k / 2));
  for (auto& b : codes) b = uint8_t(rng.next());
  std::vector<float> scales(size_t(n * k / 32));
  for (auto& v : scales) v = std::ldexp(1.0f, -7 - int(rng.next() % 3));
  WeightView view;
  view.dtype = DType::kF4E2M1;
  view.data = codes.data();
  view.rows = n;
  view.cols = k;
  view.scale_inv = scales.data();
  view.block_rows = 1;
  view.block_cols = 32;
  Result<PackedFp4Weight> one = pack_fp4_weight(view, "bench");
  CHECK(one.ok(), "packing the bench's FP4 weight");
  std::vector<PackedFp4Weight> w;
  for (int i = 0; i < sets * experts; ++i) {  // equal bytes, distinct memory
    PackedFp4Weight copy = *one;
    copy.data =
        std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(std::aligned_alloc(64, one->bytes())),
                                   [](uint8_t* q) { std::free(q); });
    std::memcpy(copy.data.get(), one->data.get(), one->bytes());
    w.push_back(std::move(copy));
  }
  std::vector<const PackedFp4Weight*> ptrs;
  for (auto& p : w) ptrs.push_back(&p);
  const int sets8 = copies_for(double(experts) * double(n) * double(k));
  std::vector<PackedInt8Weight> w8;
  {
    PackedFp8Weight f = random_fp8(n, k, rng);
    for (int i = 0; i < sets8 * experts; ++i) w8.push_back(pack_int8_weight(f));
  }
  std::vector<const PackedInt8Weight*> ptrs8;
  for (auto& p : w8) ptrs8.push_back(&p);
  std::vector<uint16_t> wb = random_bf16(size_t(n * k), rng);
  const int base_sets = copies_for(2.0 * double(experts) * double(n) * double(k));
  for (int64_t m : ms) {
    const int64_t rows = m / experts;
    const bool masked = rows <= 8;
    std::vector<uint16_t> x = random_bf16(size_t(m * k), rng);
    std::vector<float> y(size_t(m * n));
    std::vector<int64_t> off(size_t(experts + 1));
    for (int64_t e = 0; e <= experts; ++e) off[size_t(e)] = e * rows;
    std::vector<int32_t> counts(static_cast<size_t>(experts), static_cast<int32_t>(rows));
    GemmOutput out{y.data(), DType::kF32, n};
    const double dram_before = measure_dram_read_gbps(pool, 1, min_s);
    const double t = time_calls(
        [&](int i) {
          const PackedFp4Weight* const* set = ptrs.data() + i * experts;
          if (masked) {
            gemm_fp4_grouped_masked(x.data(), k, rows, counts.data(), set, experts, out, &pool);
          } else {
            gemm_fp4_grouped_contiguous(x.data(), k, off.data(), set, experts, out, &pool);
          }
        },
        sets, min_s);
    const Ceilings here = local_ceilings(ceil, dram_before, pool, min_s);
    const double t8 = time_calls(
        [&](int i) {
          const PackedInt8Weight* const* set = ptrs8.data() + i * experts;
          if (masked) {
            gemm_int8_grouped_masked(x.data(), k, rows, counts.data(), set, experts, out, &pool);
          } else {
            gemm_int8_grouped_contiguous(x.data(), k, off.data(), set, experts, out, &pool);
          }
        },
        sets8, min_s);
    OneDnnMatmul base(rows, n, k);
    for (int i = 0; i < base_sets * experts; ++i) base.add_weight(wb.data());
    const double tb = time_calls(
        [&](int i) {
          for (int64_t e = 0; e < experts; ++e)
            base.run(int(i * experts + e), x.data() + e * rows * k, y.data() + e * rows * n);
        },
        base_sets, min_s);
    report(opt, here,
           Case{"gemm_fp4_grouped", m, n, k, experts, masked ? "masked" : "contiguous", "bf16"}, t,
           tb, t8);
  }
}

// The lm_head: BF16 weights [vocab, hidden] (the checkpoints keep it in BF16) repacked into the
// tiled layout (gemm_bf16_packed, what the forward pass runs), F32 logits; the same oneDNN matmul
// as the baseline (here both read the same bytes). With gemm_int8 / gemm_int4 cases wanted, the
// head requantized as --lm-head-dtype does, each copy its own memory (vs_bf16: the BF16 head's
// time over theirs).
void run_lm_head(const GemmBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool, int64_t n,
                 int64_t k, const std::vector<int64_t>& ms, Rng& rng) {
  const double min_s = opt.quick ? 0.15 : 0.4;
  const int copies = copies_for(2.0 * double(n) * double(k));
  std::vector<std::vector<uint16_t>> w;
  w.push_back(random_bf16(size_t(n * k), rng));
  for (int i = 1; i < copies; ++i) w.push_back(w[0]);  // equal bytes, distinct memory
  std::vector<PackedBf16Weight> packed;  // what the forward pass runs (the tiled layout)
  for (int i = 0; i < copies; ++i)
    packed.push_back(pack_bf16_weight(w[size_t(i)].data(), n, k, k, &pool));
  const bool want_bf16 = wanted(opt, "gemm_bf16");
  std::vector<PackedInt8Weight> head8;
  std::vector<PackedInt4Weight> head4;
  for (int i = 0; i < copies; ++i) {
    if (wanted(opt, "gemm_int8"))
      head8.push_back(pack_int8_weight_bf16(w[0].data(), n, k, k, &pool));
    if (wanted(opt, "gemm_int4"))
      head4.push_back(pack_int4_weight_bf16(w[0].data(), n, k, k, &pool));
  }
  for (int64_t m : ms) {
    std::vector<uint16_t> x = random_bf16(size_t(m * k), rng);
    std::vector<float> y(size_t(m * n));
    const double dram_before = measure_dram_read_gbps(pool, 1, min_s);
    double t = time_calls(
        [&](int i) { gemm_bf16_packed(x.data(), m, k, packed[size_t(i)], y.data(), n, &pool); },
        copies, min_s);
    const Ceilings here = local_ceilings(ceil, dram_before, pool, min_s);
    OneDnnMatmul base(m, n, k);
    for (int i = 0; i < copies; ++i) base.add_weight(w[size_t(i)].data());
    double tb = time_calls([&](int i) { base.run(i, x.data(), y.data()); }, copies, min_s);
    if (want_bf16) report(opt, here, Case{"gemm_bf16", m, n, k, 0, "dense", "bf16"}, t, tb);
    // The head requantized (--lm-head-dtype int8 | int4), beside the BF16 one of this case.
    auto requantized = [&](const char* kernel, auto gemm) {
      const double dram = measure_dram_read_gbps(pool, 1, min_s);
      const double tq = time_calls(gemm, copies, min_s);
      report(opt, local_ceilings(ceil, dram, pool, min_s),
             Case{kernel, m, n, k, 0, "dense", "bf16"}, tq, tb, t);
    };
    if (!head8.empty()) {
      requantized("gemm_int8", [&](int i) {
        gemm_int8(x.data(), m, k, head8[size_t(i)], GemmOutput{y.data(), DType::kF32, n}, &pool);
      });
    }
    if (!head4.empty()) {
      requantized("gemm_int4", [&](int i) {
        gemm_int4(x.data(), m, k, head4[size_t(i)], GemmOutput{y.data(), DType::kF32, n}, &pool);
      });
    }
  }
}

}  // namespace

void run_gemm_benches(const GemmBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool) {
  set_onednn_threads(pool.size());
  Rng rng{0x9e3779b97f4a7c15ull};
  auto want = [&](const char* kernel) { return wanted(opt, kernel); };
  const bool int8 = want("gemm_int8") || want("gemm_int8_grouped");
  const bool int4 = want("gemm_int4_grouped");
  const bool fp4 = want("gemm_fp4_grouped");
  if (!want("gemm_bf16") && !want("gemm_fp8") && !want("gemm_fp8_grouped") && !int8 && !int4 &&
      !fp4) {
    return;
  }
  if (!opt.json) {
    fmt::print(
        "{:<22} {:>5} {:>6} {:>6} {:>3} {:<10} {:<4} {:>8} {:>8} {:>6} {:>6} {:>7}  "
        "{:<7} {}\n",
        "kernel", "m", "n", "k", "E", "layout", "act", "GB/s", "GFLOP/s", "ceil", "oneDNN",
        "vs_bf16", "bound", "DRAM GB/s (around the case)");
  }
  struct Shape {
    int64_t n, k;
  };
  // DeepSeek-V3: q_a+kv_a (2112x7168), q_b (24576x1536), kv_b (32768x512), o_proj (7168x16384),
  // shared/dense gate+up (4096x7168) and down (7168x2048).
  std::vector<Shape> shapes = {{2112, 7168},  {24576, 1536}, {32768, 512},
                               {7168, 16384}, {4096, 7168},  {7168, 2048}};
  std::vector<int64_t> ms = {1, 4, 16, 64, 256, 1024};
  if (opt.quick) {
    shapes = {{2112, 7168}, {7168, 2048}};
    ms = {1, 4, 256};
  }
  // lm_head of the bench preset (vocab 129280, hidden 2048): batch-1 decode, 32-stream serving.
  if (want("gemm_bf16") || want("gemm_int8") || want("gemm_int4")) {
    run_lm_head(opt, ceil, pool, 129280, 2048, {1, 4, 32}, rng);
  }
  // The INT8 cases run beside the FP8 ones (their vs_bf16 column is the FP8 kernel's time over
  // theirs, measured in the same case).
  if (want("gemm_fp8") || want("gemm_int8")) {
    for (const Shape& s : shapes) run_dense(opt, ceil, pool, s.n, s.k, ms, rng);
  }
  // DeepSeek-V4-Flash's FP4 experts (hidden 4096, moe_intermediate_size 2048): gate/up [2048,
  // 4096] and down [4096, 2048]; a decode step's rows (one per expert) and a prefill's.
  if (fp4) {
    run_grouped_fp4(opt, ceil, pool, 2048, 4096, 8,
                    opt.quick ? std::vector<int64_t>{8, 1024} : std::vector<int64_t>{8, 64, 1024},
                    rng);
    if (!opt.quick) run_grouped_fp4(opt, ceil, pool, 4096, 2048, 8, {8, 64, 1024}, rng);
  }
  if (!want("gemm_fp8_grouped") && !want("gemm_int8_grouped") && !int4) return;
  // Routed experts (moe_intermediate_size 2048): gate/up [2048, 7168] and down [7168, 2048];
  // the INT4 cases (--expert-dtype int4) beside them.
  if (opt.quick) {
    run_grouped(opt, ceil, pool, 2048, 7168, 8, {8, 1024}, rng);
    return;
  }
  run_grouped(opt, ceil, pool, 2048, 7168, 8, {8, 32, 1024}, rng);
  run_grouped(opt, ceil, pool, 7168, 2048, 8, {8, 32, 1024}, rng);
  run_grouped(opt, ceil, pool, 2048, 7168, 64, {64, 256, 4096}, rng);
  // The bench preset's experts at 32 decoding streams (top-8 of 64: ~4 rows per expert):
  // gate+up [1024, 2048] and down [2048, 512].
  run_grouped(opt, ceil, pool, 1024, 2048, 64, {256}, rng);
  run_grouped(opt, ceil, pool, 2048, 512, 64, {256}, rng);
}

}  // namespace moeserve::bench
