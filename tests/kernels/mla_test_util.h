// Shared by the mla_decode tests: random problems over a shuffled paged cache (never zeros;
// slots past each sequence's end hold NaN bit patterns), a naive double-precision attention
// written from the formulas of kernels/mla_decode.h, and the error bounds each level is held to.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/kv_token.h"
#include "kernels/mla_decode.h"

namespace moeserve::mla_test {

// (context_len, n_queries) of each sequence.
using SeqSpec = std::pair<int64_t, int64_t>;

inline float nonzero_uniform(std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  float f;
  do f = d(rng);
  while (std::fabs(f) < 1e-3f);
  return f;
}

struct Problem {
  MlaShape shape;
  DType cache_dtype = DType::kBF16;
  int64_t num_blocks = 0;
  std::vector<uint16_t> pool16;  // BF16 cache [num_blocks][64][D]
  std::vector<float> pool32;     // the same values as F32 (for the F32-cache level)
  std::vector<uint8_t> pool8;    // FP8 cache [num_blocks][64][token bytes] (quantize_to_fp8)
  std::vector<std::vector<int32_t>> tables;
  std::vector<MlaSequence> seqs;
  int64_t rows = 0;
  std::vector<uint16_t> q16;  // [rows, H, D] BF16
  std::vector<float> q32;     // [rows, H, D] F32 (not BF16-representable)

  MlaBatch batch(float* o, float* lse, bool q_f32 = false) const {
    MlaBatch b;
    b.shape = shape;
    const void* blocks = cache_dtype == DType::kBF16  ? static_cast<const void*>(pool16.data())
                         : cache_dtype == DType::kF32 ? static_cast<const void*>(pool32.data())
                                                      : static_cast<const void*>(pool8.data());
    b.cache = MlaCacheView{.blocks = blocks,
                           .token = {cache_dtype, shape.kv_lora_rank, shape.rope_dim},
                           .num_blocks = num_blocks};
    b.seqs = seqs;
    b.q = q_f32 ? static_cast<const void*>(q32.data()) : static_cast<const void*>(q16.data());
    b.q_dtype = q_f32 ? DType::kF32 : DType::kBF16;
    b.o = o;
    b.lse = lse;
    return b;
  }
};

inline Problem make_problem(int64_t heads, int64_t rank, int64_t rope, float scale,
                            const std::vector<SeqSpec>& specs, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.shape = MlaShape{heads, rank, rope, scale};
  const int64_t D = p.shape.dim();
  int64_t needed = 0;
  for (const SeqSpec& s : specs) needed += (s.first + 63) / 64;
  p.num_blocks = needed + 5;  // a few blocks no sequence owns
  std::vector<int32_t> ids(static_cast<size_t>(p.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);  // non-contiguous, out-of-order tables
  // Every slot starts as NaN: a kernel that lets past-the-end slots into its sums fails.
  p.pool16.assign(size_t(p.num_blocks * 64 * D), uint16_t(0x7fc1));
  size_t next = 0;
  p.tables.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto [ctx, nq] = specs[i];
    for (int64_t b = 0; b < (ctx + 63) / 64; ++b) p.tables[i].push_back(ids[next++]);
    for (int64_t t = 0; t < ctx; ++t) {
      uint16_t* tok = &p.pool16[size_t((p.tables[i][size_t(t / 64)] * 64 + t % 64) * D)];
      for (int64_t d = 0; d < D; ++d) tok[d] = f32_to_bf16(nonzero_uniform(rng));
    }
    p.rows += nq;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    p.seqs.push_back(MlaSequence{p.tables[i], specs[i].first, specs[i].second});
  }
  p.pool32.resize(p.pool16.size());
  for (size_t i = 0; i < p.pool16.size(); ++i) p.pool32[i] = bf16_to_f32(p.pool16[i]);
  p.q32.resize(size_t(p.rows * heads * D));
  p.q16.resize(p.q32.size());
  for (size_t i = 0; i < p.q32.size(); ++i) {
    p.q32[i] = nonzero_uniform(rng) * 1.7f;
    p.q16[i] = f32_to_bf16(p.q32[i]);
  }
  return p;
}

// The cache slots (block * 64 + slot in block) of every token of every sequence.
inline std::vector<int64_t> written_slots(const Problem& p) {
  std::vector<int64_t> slots;
  for (const MlaSequence& s : p.seqs) {
    for (int64_t t = 0; t < s.context_len; ++t) {
      slots.push_back(s.block_table[size_t(t / 64)] * 64 + t % 64);
    }
  }
  return slots;
}

// Scales the latent's 128-value tiles of every token by 1/4, 1/2, 1 or 2 (varying with the
// token and the tile; exact in BF16), so that an FP8 cache's tiles get different scales: a
// kernel that mixes them up then reads other values.
inline void vary_tile_scales(Problem& p) {
  const int64_t D = p.shape.dim();
  for (const int64_t slot : written_slots(p)) {
    for (int64_t i = 0; i < p.shape.kv_lora_rank; ++i) {
      const size_t at = size_t(slot * D + i);
      p.pool32[at] = std::ldexp(p.pool32[at], int((slot + i / kKvFp8Tile) % 4) - 2);
      p.pool16[at] = f32_to_bf16(p.pool32[at]);
    }
  }
}

// Makes p's cache values FP8-representable: every token of every sequence is quantized into
// pool8 (FlashMLA's format, kernels/kv_token.h) and pool16 / pool32 get the values read back,
// exact in BF16, so the three caches hold the same values (the naive attention reads pool32).
// Slots past each sequence's end are 0xff bytes in pool8 (e4m3 NaN, NaN scales and rope).
inline void quantize_to_fp8(Problem& p) {
  const KvTokenFormat f{DType::kF8E4M3, p.shape.kv_lora_rank, p.shape.rope_dim};
  const int64_t D = p.shape.dim(), tb = f.bytes();
  p.pool8.assign(size_t(p.num_blocks * 64 * tb), 0xff);
  for (const int64_t slot : written_slots(p)) {
    float* v = &p.pool32[size_t(slot * D)];
    kv_token_store(f, v, &p.pool8[size_t(slot * tb)]);
    kv_token_load(f, &p.pool8[size_t(slot * tb)], v);
    for (int64_t d = 0; d < D; ++d) {
      p.pool16[size_t(slot * D + d)] = f32_to_bf16(v[d]);
      ASSERT_EQ(bf16_to_f32(p.pool16[size_t(slot * D + d)]), v[d]) << "not exact in BF16";
    }
  }
}

// An attention's outputs (in double, for comparisons).
struct Attention {
  std::vector<double> o, lse;  // [rows * H, R], [rows * H]
};

// Naive causal attention in double on the queries q ([rows, H, D] floats).
inline Attention naive(const Problem& p, const std::vector<float>& q) {
  const int64_t H = p.shape.heads, R = p.shape.kv_lora_rank, D = p.shape.dim();
  Attention r{std::vector<double>(size_t(p.rows * H * R)), std::vector<double>(size_t(p.rows * H))};
  int64_t row = 0;
  for (const MlaSequence& s : p.seqs) {
    for (int64_t i = 0; i < s.n_queries; ++i, ++row) {
      const int64_t n = s.context_len - s.n_queries + i + 1;  // causal: tokens [0, pos]
      std::vector<const float*> tok(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) {
        tok[size_t(t)] = &p.pool32[size_t((s.block_table[size_t(t / 64)] * 64 + t % 64) * D)];
      }
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = &q[size_t((row * H + h) * D)];
        std::vector<double> sc(static_cast<size_t>(n));
        double mx = -INFINITY;
        for (int64_t t = 0; t < n; ++t) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(qh[d]) * tok[size_t(t)][d];
          sc[size_t(t)] = dot * p.shape.softmax_scale;
          mx = std::max(mx, sc[size_t(t)]);
        }
        double sum = 0;
        for (double& v : sc) sum += (v = std::exp(v - mx));
        double* o = &r.o[size_t((row * H + h) * R)];
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t j = 0; j < R; ++j) o[j] += sc[size_t(t)] / sum * tok[size_t(t)][j];
        }
        r.lse[size_t(row * H + h)] = mx + std::log(sum);
      }
    }
  }
  return r;
}

inline Attention naive_bf16_q(const Problem& p) {
  std::vector<float> q(p.q16.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_to_f32(p.q16[i]);
  return naive(p, q);
}

// Error bounds. The fast level rounds each softmax weight to BF16 (relative error <= 2^-9) and
// normalises by the sum of the rounded weights, so o moves by at most 2^-9 * max|v - o| <=
// 2^-9 * 2 (|v| <= 1) and lse by at most 2^-9; FP32 sums add far less. Rounding errors of
// different weights are independent, so the mean error is much smaller than the bound.
struct Tol {
  double o_max, o_mean, lse_max;
};
constexpr Tol kFastTol{4.2e-3, 4e-4, 2.2e-3};
constexpr Tol kRefTol{2e-5, 2e-6, 2e-5};  // FP32 reference vs double
// F32 queries with MlaOptions::split_p: q and P both carried as BF16 hi + lo (relative error
// <= 2^-17 each), so the kernel is held to the FP32 reference's own accuracy. BF16-rounded
// queries miss it by far (BF16QueriesFailTheSplitTolerance).
constexpr Tol kSplitTol = kRefTol;

inline void expect_close(const std::vector<float>& o, const std::vector<float>& lse,
                         const Attention& want, const Tol& tol, const std::string& what) {
  ASSERT_EQ(o.size(), want.o.size());
  double max_err = 0, sum_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    double e = std::fabs(double(o[i]) - want.o[i]);
    if (!(e <= max_err)) worst = i;  // NaN lands here too
    max_err = std::isnan(e) ? INFINITY : std::max(max_err, e);
    sum_err += e;
  }
  EXPECT_LE(max_err, tol.o_max) << what << ": o[" << worst << "] = " << o[worst] << ", want "
                                << want.o[worst];
  EXPECT_LE(sum_err / double(o.size()), tol.o_mean) << what << ": mean |error| of o";
  for (size_t i = 0; i < lse.size(); ++i) {
    ASSERT_LE(std::fabs(double(lse[i]) - want.lse[i]), tol.lse_max)
        << what << ": lse[" << i << "] = " << lse[i] << ", want " << want.lse[i];
  }
}

struct Output {
  std::vector<float> o, lse;
};

inline Output run(const Problem& p, ThreadPool* pool, MlaOptions opt, Isa isa, bool q_f32 = false) {
  if (isa < Isa::kAvx512Bf16) opt.split_p = false;  // (only the BF16 level reads it)
  const int64_t H = p.shape.heads;
  Output out{std::vector<float>(size_t(p.rows * H * p.shape.kv_lora_rank), -7.0f),
             std::vector<float>(size_t(p.rows * H), -7.0f)};
  mla_decode(p.batch(out.o.data(), out.lse.data(), q_f32), pool, opt, isa);
  return out;
}

}  // namespace moeserve::mla_test
