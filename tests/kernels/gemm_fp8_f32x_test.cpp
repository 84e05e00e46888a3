// gemm_fp8_f32x at every ISA level this CPU has, against the double-precision reference with the
// same F32 X: dense (M 1..300 sampled), grouped-contiguous and grouped-masked, F32 and BF16
// outputs, N and K off the 128 grid, empty and one-row experts, every FP8 byte exact. The
// tolerance is FP32 accumulation error; a guard test shows it is tight enough that rounding X to
// BF16 (what gemm_fp8 does) fails it.
#include "kernels/gemm_fp8_f32x.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../test_isa.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "gemm_fp8_problem.h"

namespace moeserve {
namespace {

using Problem = testing::Fp8Problem;
Problem make_problem(int64_t n, int64_t k, std::mt19937& rng) {
  return testing::make_fp8_problem(n, k, rng);
}

// F32 X with full 24-bit mantissas (not BF16-representable), rows of different magnitudes.
std::vector<float> random_x(int64_t rows, int64_t ld, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(size_t(rows * ld));
  for (int64_t i = 0; i < rows; ++i) {
    const float row_scale = std::pow(10.0f, float(i % 5 - 2));
    for (int64_t j = 0; j < ld; ++j) {
      float f;
      do f = d(rng);
      while (std::fabs(f) < 1e-3f);
      x[size_t(i * ld + j)] = f * row_scale;
    }
  }
  return x;
}

// Sum of |x * w * s| for one row of X and column j: the scale of an FP32 sum's rounding error.
double magnitude(const float* x, const Problem& p, int64_t j) {
  double m = 0;
  int64_t kbs = (p.k + 127) / 128;
  for (int64_t kk = 0; kk < p.k; ++kk) {
    m += std::fabs(double(x[kk]) * fp8e4m3_to_f32(p.w[size_t(j * p.k + kk)]) *
                   p.scale[size_t((j / 128) * kbs + kk / 128)]);
  }
  return m;
}

// Number of entries of rows [0, rows) of y (row stride ldy) outside FP32 accumulation error of
// the reference for X rows x (stride ldx); reports the first few when `report`.
int mismatches(const float* x, int64_t rows, int64_t ldx, const Problem& p, const void* y, DType dt,
               int64_t ldy, const std::string& what, bool report = true) {
  std::vector<float> ref(size_t(rows * p.n));
  gemm_fp8_f32x_ref(x, rows, ldx, p.w.data(), p.scale.data(), p.n, p.k, ref.data());
  int failures = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double got = dt == DType::kF32 ? static_cast<const float*>(y)[i * ldy + j]
                                     : bf16_to_f32(static_cast<const uint16_t*>(y)[i * ldy + j]);
      double want = ref[size_t(i * p.n + j)];
      // FP32 accumulation: a few ulps of the magnitude per 128-block sum and across blocks.
      double tol = 4e-6 * magnitude(x + i * ldx, p, j) + 1e-30;
      if (dt == DType::kBF16) tol += std::fabs(want) * (1.0 / 256);
      if (!(std::fabs(got - want) <= tol)) {
        if (report && failures < 5) {
          ADD_FAILURE() << what << " row " << i << " col " << j << ": got " << got << " want "
                        << want << " tol " << tol;
        }
        ++failures;
      }
    }
  }
  return failures;
}

TEST(GemmFp8F32x, DenseMatchesReferenceAtEveryLevel) {
  std::mt19937 rng(12);
  ThreadPool pool(2);
  struct Shape {
    int64_t n, k;
  };
  const Shape shapes[] = {{1, 1},     {7, 129},  {129, 7},  {200, 513},
                          {513, 200}, {64, 256}, {130, 255}};
  const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 10, 11, 13, 37, 300};
  for (const Shape& s : shapes) {
    Problem p = make_problem(s.n, s.k, rng);
    for (int64_t m : ms) {
      if (s.n * s.k * m > 4'000'000) continue;  // keep the double reference fast
      int64_t ldx = s.k + 3;
      std::vector<float> x = random_x(m, ldx, rng);
      for (Isa isa : testing::isa_levels()) {
        for (DType dt : {DType::kF32, DType::kBF16}) {
          int64_t ldy = s.n + 5;
          std::vector<uint8_t> y(size_t(m * ldy) * dtype_size(dt), 0xcd);
          gemm_fp8_f32x(x.data(), m, ldx, p.packed, GemmOutput{y.data(), dt, ldy},
                        (m & 1) ? &pool : nullptr, isa);
          std::string what = std::string(isa_name(isa)) + " " + dtype_name(dt) +
                             " m=" + std::to_string(m) + " n=" + std::to_string(s.n) +
                             " k=" + std::to_string(s.k);
          EXPECT_EQ(mismatches(x.data(), m, ldx, p, y.data(), dt, ldy, what), 0) << what;
          // Padding columns between n and ldy stay untouched.
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = s.n * int64_t(dtype_size(dt)); j < ldy * int64_t(dtype_size(dt)); ++j)
              ASSERT_EQ(y[size_t(i * ldy) * dtype_size(dt) + size_t(j)], 0xcd) << what;
        }
      }
    }
  }
}

TEST(GemmFp8F32x, SampledRowCountsUpTo300) {
  std::mt19937 rng(13);
  ThreadPool pool(2);
  Problem p = make_problem(136, 300, rng);
  std::uniform_int_distribution<int64_t> mdist(1, 300);
  for (int trial = 0; trial < 12; ++trial) {
    int64_t m = mdist(rng);
    std::vector<float> x = random_x(m, p.k, rng);
    for (Isa isa : testing::isa_levels()) {
      std::vector<float> y(size_t(m * p.n));
      gemm_fp8_f32x(x.data(), m, p.k, p.packed, GemmOutput{y.data(), DType::kF32, p.n}, &pool, isa);
      std::string what = std::string(isa_name(isa)) + " m=" + std::to_string(m);
      EXPECT_EQ(mismatches(x.data(), m, p.k, p, y.data(), DType::kF32, p.n, what), 0) << what;
    }
  }
}

// A row's result must not depend on how many rows run with it (the converting small-M block and
// the converted-tile block do the same arithmetic): every prefix of 300 rows gives the same
// bits for its rows, at every level.
TEST(GemmFp8F32x, RowsDoNotDependOnM) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  Problem p = make_problem(136, 300, rng);
  const int64_t max_m = 300;
  std::vector<float> x = random_x(max_m, p.k, rng);
  for (Isa isa : testing::isa_levels()) {
    std::vector<float> all(size_t(max_m * p.n));
    gemm_fp8_f32x(x.data(), max_m, p.k, p.packed, GemmOutput{all.data(), DType::kF32, p.n}, &pool,
                  isa);
    for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 11, 64}) {
      std::vector<float> y(size_t(m * p.n));
      gemm_fp8_f32x(x.data(), m, p.k, p.packed, GemmOutput{y.data(), DType::kF32, p.n}, &pool, isa);
      for (int64_t i = 0; i < m * p.n; ++i) {
        ASSERT_EQ(y[size_t(i)], all[size_t(i)]) << isa_name(isa) << " m=" << m << " at " << i;
      }
    }
  }
}

// The tolerance above must catch the BF16 rounding of X: gemm_fp8 on the same data fails it for
// most entries (so the F32 levels passing means they did not round X).
TEST(GemmFp8F32x, ToleranceRejectsBf16RoundedActivations) {
  std::mt19937 rng(14);
  Problem p = make_problem(130, 384, rng);
  const int64_t m = 8;
  std::vector<float> x = random_x(m, p.k, rng);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
  std::vector<float> y(size_t(m * p.n));
  gemm_fp8(xb.data(), m, p.k, p.packed, GemmOutput{y.data(), DType::kF32, p.n}, nullptr);
  int bad = mismatches(x.data(), m, p.k, p, y.data(), DType::kF32, p.n, "bf16", false);
  EXPECT_GT(bad, m * p.n / 2);
  gemm_fp8_f32x(x.data(), m, p.k, p.packed, GemmOutput{y.data(), DType::kF32, p.n}, nullptr);
  EXPECT_EQ(mismatches(x.data(), m, p.k, p, y.data(), DType::kF32, p.n, "f32x"), 0);
}

TEST(GemmFp8F32x, GroupedContiguousWithEmptyAndOneRowExperts) {
  std::mt19937 rng(15);
  ThreadPool pool(2);
  const int64_t n = 130, k = 257;
  const std::vector<int64_t> rows = {3, 0, 1, 17, 0, 0, 1, 40, 5};  // per expert
  std::vector<Problem> ex;
  std::vector<const PackedFp8Weight*> ptrs;
  for (size_t e = 0; e < rows.size(); ++e) ex.push_back(make_problem(n, k, rng));
  for (auto& e : ex) ptrs.push_back(&e.packed);
  std::vector<int64_t> off(rows.size() + 1, 0);
  for (size_t e = 0; e < rows.size(); ++e) off[e + 1] = off[e] + rows[e];
  const int64_t total = off.back();
  std::vector<float> x = random_x(total, k, rng);
  for (Isa isa : testing::isa_levels()) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      std::vector<uint8_t> y(size_t(total * n) * dtype_size(dt));
      gemm_fp8_f32x_grouped_contiguous(x.data(), k, off.data(), ptrs.data(), int64_t(ptrs.size()),
                                       GemmOutput{y.data(), dt, n}, &pool, isa);
      for (size_t e = 0; e < rows.size(); ++e) {
        if (rows[e] == 0) continue;
        std::string what =
            std::string(isa_name(isa)) + " " + dtype_name(dt) + " expert " + std::to_string(e);
        EXPECT_EQ(mismatches(x.data() + off[e] * k, rows[e], k, ex[e],
                             y.data() + size_t(off[e] * n) * dtype_size(dt), dt, n, what),
                  0)
            << what;
      }
    }
  }
}

TEST(GemmFp8F32x, GroupedMaskedLeavesRowsPastCountUntouched) {
  std::mt19937 rng(16);
  ThreadPool pool(2);
  const int64_t n = 200, k = 129, cap = 9;
  const std::vector<int32_t> counts = {0, 1, 9, 4, 0, 2, 5};
  std::vector<Problem> ex;
  std::vector<const PackedFp8Weight*> ptrs;
  for (size_t e = 0; e < counts.size(); ++e) ex.push_back(make_problem(n, k, rng));
  for (auto& e : ex) ptrs.push_back(&e.packed);
  const int64_t ne = int64_t(counts.size());
  std::vector<float> x = random_x(ne * cap, k, rng);
  for (Isa isa : testing::isa_levels()) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const size_t es = dtype_size(dt);
      std::vector<uint8_t> y(size_t(ne * cap * n) * es, 0xab);
      gemm_fp8_f32x_grouped_masked(x.data(), k, cap, counts.data(), ptrs.data(), ne,
                                   GemmOutput{y.data(), dt, n}, &pool, isa);
      for (int64_t e = 0; e < ne; ++e) {
        std::string what =
            std::string(isa_name(isa)) + " " + dtype_name(dt) + " expert " + std::to_string(e);
        if (counts[size_t(e)] > 0) {
          EXPECT_EQ(mismatches(x.data() + e * cap * k, counts[size_t(e)], k, ex[size_t(e)],
                               y.data() + size_t(e * cap * n) * es, dt, n, what),
                    0)
              << what;
        }
        for (int64_t i = counts[size_t(e)]; i < cap; ++i)
          for (size_t b = 0; b < size_t(n) * es; ++b)
            ASSERT_EQ(y[size_t((e * cap + i) * n) * es + b], 0xab) << what << " row " << i;
      }
    }
  }
}

// Every FP8 byte (subnormals and both zeros included) times one-hot X rows must come out exact,
// through the in-register conversion (up to 4 rows) and the F32 tile (more rows).
TEST(GemmFp8F32x, EveryFp8ValueConvertsExactly) {
  const int64_t n = 256, k = 128;
  std::vector<uint8_t> w(size_t(n * k));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) w[size_t(i * k + j)] = uint8_t((i + j) & 0xff);
  for (auto& b : w)
    if ((b & 0x7f) == 0x7f) b = 0x7e;  // NaN is not a weight
  std::vector<float> scale(2, 1.0f);
  PackedFp8Weight p = pack_fp8_weight(w.data(), scale.data(), n, k);
  const std::vector<int64_t> cols = {0, 1, 5, 127, 2, 3, 64, 126, 77, 100, 33};
  const int64_t m = int64_t(cols.size());
  std::vector<float> x(size_t(m * k), 0.0f);
  for (int64_t r = 0; r < m; ++r) x[size_t(r * k + cols[size_t(r)])] = 1.0f;
  for (Isa isa : testing::isa_levels()) {
    for (int64_t rows : {int64_t(1), int64_t(4), m}) {  // in-register path (<= 4), tile path
      std::vector<float> y(size_t(rows * n));
      gemm_fp8_f32x(x.data(), rows, k, p, GemmOutput{y.data(), DType::kF32, n}, nullptr, isa);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(y[size_t(r * n + i)], fp8e4m3_to_f32(w[size_t(i * k + cols[size_t(r)])]))
              << isa_name(isa) << " rows " << rows << " row " << r << " byte "
              << int(w[size_t(i * k + cols[size_t(r)])]);
    }
  }
}

}  // namespace
}  // namespace moeserve
