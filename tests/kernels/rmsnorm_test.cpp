// The fast RMSNorm (kernels/rmsnorm.h) at every ISA level against rmsnorm_ref: within a few ulp
// everywhere and the reference's bits on nearly every row, the same bits at AVX2 and AVX-512,
// rows independent of the call (one at a time == all at once), in place == out of place, and
// nothing written outside the rows.
#include "kernels/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "../test_isa.h"

namespace moeserve {
namespace {

struct Problem {
  int64_t n_rows, dim, ldx, ldy;
  std::vector<float> x, weight;
};

Problem make_problem(int64_t n_rows, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> w(0.2f, 2.0f);
  Problem p{n_rows, dim, dim + 3, dim + 5, {}, {}};
  p.x.resize(size_t(n_rows * p.ldx));
  for (int64_t r = 0; r < n_rows; ++r) {
    const float scale = std::pow(10.0f, float(int(r % 7) - 3));  // rows from 1e-3 to 1e3
    for (int64_t i = 0; i < p.ldx; ++i) p.x[size_t(r * p.ldx + i)] = normal(rng) * scale;
  }
  p.weight.resize(size_t(dim));
  for (float& v : p.weight) v = w(rng);
  return p;
}

constexpr float kEps = 1e-6f;

TEST(Rmsnorm, FastKernelMatchesReferenceAtEveryLevel) {
  int64_t rows_total = 0, rows_differing = 0;
  for (int64_t dim : {1, 7, 16, 31, 32, 33, 100, 512, 2048, 2055, 7168}) {
    const int64_t n = 37;
    Problem p = make_problem(n, dim, uint32_t(dim));
    std::vector<float> want(size_t(n * p.ldy), -9.0f);
    rmsnorm_ref(p.x.data(), n, dim, p.ldx, p.weight.data(), kEps, want.data(), p.ldy);
    std::vector<float> first_simd;
    for (Isa isa : testing::isa_levels()) {
      std::vector<float> y(size_t(n * p.ldy), -9.0f);
      rmsnorm_isa(p.x.data(), n, dim, p.ldx, p.weight.data(), kEps, y.data(), p.ldy, isa);
      for (int64_t r = 0; r < n; ++r) {
        bool row_differs = false;
        for (int64_t i = 0; i < p.ldy; ++i) {
          const size_t k = size_t(r * p.ldy + i);
          if (i >= dim) {
            ASSERT_EQ(y[k], -9.0f) << "wrote past the row: " << isa_name(isa) << " dim=" << dim;
            continue;
          }
          // 1/sqrt may round to a neighbouring float (1 ulp), then two F32 multiplies.
          ASSERT_LE(testing::ulps(y[k], want[k]), 3)
              << isa_name(isa) << " dim=" << dim << " row " << r << " i=" << i << ": " << y[k]
              << " vs " << want[k];
          row_differs |= y[k] != want[k];
        }
        if (isa != Isa::kScalar) {
          ++rows_total;
          rows_differing += row_differs;
        }
      }
      if (isa == Isa::kScalar) {
        for (size_t k = 0; k < y.size(); ++k) ASSERT_TRUE(testing::same_bits(y[k], want[k]));
      } else if (first_simd.empty()) {
        first_simd = y;
      } else {
        for (size_t k = 0; k < y.size(); ++k) {
          ASSERT_TRUE(testing::same_bits(y[k], first_simd[k]))
              << isa_name(isa) << " differs from the first SIMD level, dim=" << dim << " k=" << k;
        }
      }
    }
  }
  // The FP64 sums differ only in order: a differing float 1/sqrt is a rare rounding tie-break.
  EXPECT_LE(rows_differing * 100, rows_total) << rows_differing << " of " << rows_total;
}

TEST(Rmsnorm, RowsDoNotDependOnTheCallAndMayBeNormalizedInPlace) {
  for (int64_t dim : {1, 33, 2048, 2053}) {
    const int64_t n = 9;
    Problem p = make_problem(n, dim, 77 + uint32_t(dim));
    for (Isa isa : testing::isa_levels()) {
      std::vector<float> all(size_t(n * p.ldy));
      rmsnorm_isa(p.x.data(), n, dim, p.ldx, p.weight.data(), kEps, all.data(), p.ldy, isa);
      std::vector<float> in_place = p.x;  // y == x, stride ldx
      rmsnorm_isa(in_place.data(), n, dim, p.ldx, p.weight.data(), kEps, in_place.data(), p.ldx,
                  isa);
      for (int64_t r = 0; r < n; ++r) {
        std::vector<float> one(static_cast<size_t>(dim));
        rmsnorm_isa(&p.x[size_t(r * p.ldx)], 1, dim, p.ldx, p.weight.data(), kEps, one.data(), dim,
                    isa);
        for (int64_t i = 0; i < dim; ++i) {
          const float a = all[size_t(r * p.ldy + i)];
          ASSERT_TRUE(testing::same_bits(one[size_t(i)], a)) << isa_name(isa) << " row " << r;
          ASSERT_TRUE(testing::same_bits(in_place[size_t(r * p.ldx + i)], a))
              << isa_name(isa) << " in place, row " << r;
        }
        for (int64_t i = dim; i < p.ldx; ++i) {  // the gap between rows is left alone
          ASSERT_TRUE(
              testing::same_bits(in_place[size_t(r * p.ldx + i)], p.x[size_t(r * p.ldx + i)]));
        }
      }
    }
  }
}

TEST(Rmsnorm, ZeroRowGivesZerosAndExtremeScalesStayFinite) {
  const int64_t dim = 50;
  std::vector<float> w(size_t(dim), 1.5f);
  std::vector<float> x(size_t(3 * dim), 0.0f);
  for (int64_t i = 0; i < dim; ++i) {
    x[size_t(dim + i)] = 3e38f * (i % 2 ? -1.0f : 1.0f);  // squares overflow F32, not FP64
    x[size_t(2 * dim + i)] = 1e-42f * float(i + 1);       // subnormals
  }
  std::vector<float> want(x.size());
  rmsnorm_ref(x.data(), 3, dim, dim, w.data(), kEps, want.data(), dim);
  for (Isa isa : testing::isa_levels()) {
    std::vector<float> y(x.size(), -1.0f);
    rmsnorm_isa(x.data(), 3, dim, dim, w.data(), kEps, y.data(), dim, isa);
    for (size_t k = 0; k < y.size(); ++k) {
      ASSERT_TRUE(std::isfinite(y[k])) << isa_name(isa) << " k=" << k;
      ASSERT_LE(testing::ulps(y[k], want[k]), 3) << isa_name(isa) << " k=" << k;
    }
    for (int64_t i = 0; i < dim; ++i) EXPECT_EQ(y[size_t(i)], 0.0f);
  }
}

}  // namespace
}  // namespace moeserve
