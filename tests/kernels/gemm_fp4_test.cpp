// gemm_fp4 at every ISA level this CPU has. Two oracles: the contract of gemm_fp4.h written out
// here from scratch (every level must give its bits exactly), and the exact (double) product with
// the checkpoint's FP4 values as WeightView dequantizes them, which the result must meet within
// the bound of F32 summation.
#include "kernels/gemm_fp4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../test_isa.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace moeserve {
namespace {

// An FP4 weight as DeepSeek-V4's checkpoints hold one: codes two a byte (element 2j in the low
// nibble of byte j), one power-of-two scale per row and 32 columns.
struct Fp4Problem {
  int64_t n, k;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  WeightView view() const {
    WeightView v;
    v.dtype = DType::kF4E2M1;
    v.data = bytes.data();
    v.rows = n;
    v.cols = k;
    v.scale_inv = scales.data();
    v.block_rows = 1;
    v.block_cols = 32;
    return v;
  }
};

Fp4Problem make_problem(int64_t n, int64_t k, std::mt19937& rng) {
  Fp4Problem p{n, k, std::vector<uint8_t>(size_t(n * k / 2)),
               std::vector<float>(size_t(n * k / 32))};
  std::uniform_int_distribution<int> byte(0, 255), e(118, 130);
  for (auto& b : p.bytes) b = uint8_t(byte(rng));
  for (auto& s : p.scales) s = f8e8m0_to_f32(uint8_t(e(rng)));
  p.scales[0] = 0.0f;                                // an exact zero
  p.scales[p.scales.size() / 2] = f8e8m0_to_f32(0);  // 2^-127: exponent 0 as well
  return p;
}

std::vector<uint16_t> random_x(int64_t rows, int64_t ld, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<uint16_t> x(size_t(rows * ld));
  for (auto& v : x) v = f32_to_bf16(d(rng));
  return x;
}

PackedFp4Weight pack(const Fp4Problem& p) {
  Result<PackedFp4Weight> w = pack_fp4_weight(p.view(), "w");
  EXPECT_TRUE(w.ok()) << w.status().message();
  return std::move(*w);
}

// gemm_fp4.h's contract for one row: y [n] F32.
void contract_row(const uint16_t* x, const PackedFp4Weight& w, float* y) {
  for (int64_t j = 0; j < w.n; ++j) {
    float tot = 0;
    for (int64_t sb = 0; sb < w.k / 32; ++sb) {
      float sum = 0;
      for (int64_t kk = sb * 32; kk < sb * 32 + 32; kk += 2) {
        sum = std::fma(bf16_to_f32(x[kk + 1]), fp4e2m1_to_f32(w.at(j, kk + 1)), sum);
        sum = std::fma(bf16_to_f32(x[kk]), fp4e2m1_to_f32(w.at(j, kk)), sum);
      }
      const uint8_t e = w.exponent(j, sb * 32);
      const float ws = e == 0 ? 0.0f : std::ldexp(1.0f, int(e) - 127);
      tot = sb == 0 ? sum * ws : std::fma(sum, ws, tot);
    }
    y[j] = tot;
  }
}

void expect_contract(const uint16_t* x, int64_t rows, int64_t ldx, const PackedFp4Weight& w,
                     const void* y, DType dt, int64_t ldy, const std::string& what) {
  std::vector<float> want(static_cast<size_t>(w.n));
  int failures = 0;
  for (int64_t i = 0; i < rows && failures < 5; ++i) {
    contract_row(x + i * ldx, w, want.data());
    for (int64_t j = 0; j < w.n && failures < 5; ++j) {
      const float got = dt == DType::kF32
                            ? static_cast<const float*>(y)[i * ldy + j]
                            : bf16_to_f32(static_cast<const uint16_t*>(y)[i * ldy + j]);
      const float ref =
          dt == DType::kF32 ? want[size_t(j)] : bf16_to_f32(f32_to_bf16(want[size_t(j)]));
      if (!testing::same_bits(got, ref)) {
        ADD_FAILURE() << what << " row " << i << " col " << j << ": got " << got << " want " << ref;
        ++failures;
      }
    }
  }
}

TEST(GemmFp4, PackKeepsEveryCodeAndExponent) {
  std::mt19937 rng(1);
  const int64_t n = 130, k = 288;  // K off the 128 grid, on the 32 one
  Fp4Problem p = make_problem(n, k, rng);
  PackedFp4Weight w = pack(p);
  EXPECT_EQ(w.bytes(), size_t(w.n_panels() * w.k_blocks() * (4096 + 256)));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) {
      ASSERT_EQ(w.at(j, kk), (p.bytes[size_t((j * k + kk) / 2)] >> (4 * (kk % 2))) & 15)
          << j << " " << kk;
      const float s = p.scales[size_t(j * (k / 32) + kk / 32)];
      const uint8_t e = w.exponent(j, kk);
      ASSERT_EQ(e == 0 ? 0.0f : std::ldexp(1.0f, int(e) - 127), s < 1e-38f ? 0.0f : s);
    }
    for (int64_t kk = k; kk < w.k_blocks() * 128; ++kk) ASSERT_EQ(w.at(j, kk), 0) << "K padding";
  }
  // Its values are WeightView's dequantization.
  std::vector<float> row(static_cast<size_t>(k));
  p.view().row_to_f32(77, row.data());
  for (int64_t kk = 0; kk < k; ++kk) {
    const uint8_t e = w.exponent(77, kk);
    EXPECT_EQ(row[size_t(kk)],
              fp4e2m1_to_f32(w.at(77, kk)) * (e == 0 ? 0.0f : std::ldexp(1.0f, int(e) - 127)))
        << kk;
  }
}

TEST(GemmFp4, PackRefusesScalesThatAreNotUe8m0AndKOffTheGrid) {
  std::mt19937 rng(2);
  for (float bad : {3.0f, -1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    Fp4Problem p = make_problem(64, 64, rng);
    p.scales[5] = bad;
    Result<PackedFp4Weight> w = pack_fp4_weight(p.view(), "layers.0.ffn.experts.3.w1.weight");
    ASSERT_FALSE(w.ok()) << bad;
    EXPECT_NE(w.status().message().find("layers.0.ffn.experts.3.w1.weight"), std::string::npos);
    EXPECT_NE(w.status().message().find("row 2"), std::string::npos) << w.status().message();
  }
  Fp4Problem p = make_problem(4, 64, rng);
  WeightView v = p.view();
  v.cols = 48;
  EXPECT_FALSE(pack_fp4_weight(v, "w").ok());
}

// Dense: row counts 1..300, N and K off the panel and block grids, F32 and BF16 outputs, every
// level bit-exact to the contract.
TEST(GemmFp4, DenseGivesTheContractsBitsAtEveryLevel) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  struct Shape {
    int64_t n, k;
  };
  for (Shape s : {Shape{64, 128}, Shape{130, 256}, Shape{200, 64}, Shape{67, 544}}) {
    Fp4Problem p = make_problem(s.n, s.k, rng);
    PackedFp4Weight w = pack(p);
    for (int64_t m : {1, 2, 5, 6, 7, 16, 17, 33, 65, 129, 300}) {
      const int64_t ldx = s.k + 3;
      std::vector<uint16_t> x = random_x(m, ldx, rng);
      for (Isa isa : testing::isa_levels()) {
        for (DType dt : {DType::kF32, DType::kBF16}) {
          std::vector<uint8_t> y(size_t(m * s.n) * dtype_size(dt));
          gemm_fp4(x.data(), m, ldx, w, GemmOutput{y.data(), dt, s.n}, &pool, isa);
          expect_contract(x.data(), m, ldx, w, y.data(), dt, s.n,
                          std::string(isa_name(isa)) + " " + dtype_name(dt) +
                              " m=" + std::to_string(m) + " n=" + std::to_string(s.n) +
                              " k=" + std::to_string(s.k));
        }
      }
    }
  }
}

// Against the exact (double) product with the FP4 values: the weights and X are exact, so the
// only error is the F32 summation's: at most 2^-24 of the magnitude sum per add (32 per
// sub-block, then the scaled sum into the total).
TEST(GemmFp4, WithinTheSummationRoundingOfTheExactProduct) {
  std::mt19937 rng(4);
  ThreadPool pool(2);
  const int64_t n = 150, k = 704, m = 40;
  Fp4Problem p = make_problem(n, k, rng);
  PackedFp4Weight w = pack(p);
  std::vector<uint16_t> x = random_x(m, k, rng);
  std::vector<float> y(size_t(m * n)), wrow(static_cast<size_t>(k));
  gemm_fp4(x.data(), m, k, w, GemmOutput{y.data(), DType::kF32, n}, &pool);
  double worst = 0;
  for (int64_t j = 0; j < n; ++j) {
    p.view().row_to_f32(j, wrow.data());
    for (int64_t i = 0; i < m; ++i) {
      double exact = 0, mag = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double v = double(bf16_to_f32(x[size_t(i * k + kk)])) * wrow[size_t(kk)];
        exact += v;
        mag += std::fabs(v);
      }
      const double bound = (32 + 2) * std::ldexp(mag, -24) + 1e-30;
      const double err = std::fabs(double(y[size_t(i * n + j)]) - exact);
      ASSERT_LE(err, bound) << i << " " << j;
      worst = std::max(worst, err / bound);
    }
  }
  EXPECT_LT(worst, 0.5);  // errors that cancel stay well inside the worst case
}

struct Grouped {
  std::vector<Fp4Problem> problems;
  std::vector<PackedFp4Weight> packed;
  std::vector<const PackedFp4Weight*> ptrs;
  std::vector<int64_t> off;
};

Grouped make_grouped(const std::vector<int64_t>& rows, int64_t n, int64_t k, std::mt19937& rng) {
  Grouped g;
  for (size_t e = 0; e < rows.size(); ++e) g.problems.push_back(make_problem(n, k, rng));
  for (auto& p : g.problems) g.packed.push_back(pack(p));
  for (auto& w : g.packed) g.ptrs.push_back(&w);
  g.off.assign(rows.size() + 1, 0);
  for (size_t e = 0; e < rows.size(); ++e) g.off[e + 1] = g.off[e] + rows[e];
  return g;
}

TEST(GemmFp4, GroupedContiguousAndGatherWithEmptyAndOneRowExperts) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  const int64_t n = 130, k = 288, tokens = 30;
  const std::vector<int64_t> rows = {3, 0, 1, 17, 0, 40, 1};
  Grouped g = make_grouped(rows, n, k, rng);
  const int64_t total = g.off.back(), ldx = k + 2;
  std::vector<uint16_t> token_rows = random_x(tokens, ldx, rng);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(tokens - 1));
  std::vector<int32_t> src(static_cast<size_t>(total));
  std::vector<uint16_t> copied(size_t(total * k));
  for (int64_t i = 0; i < total; ++i) {
    src[size_t(i)] = pick(rng);
    std::copy_n(&token_rows[size_t(src[size_t(i)] * ldx)], k, &copied[size_t(i * k)]);
  }
  for (Isa isa : testing::isa_levels()) {
    std::vector<float> y(size_t(total * n)), yg(y.size());
    gemm_fp4_grouped_contiguous(copied.data(), k, g.off.data(), g.ptrs.data(), int64_t(rows.size()),
                                GemmOutput{y.data(), DType::kF32, n}, &pool, isa);
    gemm_fp4_grouped_contiguous_gather(token_rows.data(), ldx, src.data(), g.off.data(),
                                       g.ptrs.data(), int64_t(rows.size()),
                                       GemmOutput{yg.data(), DType::kF32, n}, &pool, isa);
    EXPECT_EQ(yg, y) << isa_name(isa) << " gathered rows give the copied rows' bits";
    for (size_t e = 0; e < rows.size(); ++e) {
      if (rows[e] == 0) continue;
      expect_contract(copied.data() + g.off[e] * k, rows[e], k, g.packed[e],
                      y.data() + g.off[e] * n, DType::kF32, n,
                      std::string(isa_name(isa)) + " expert " + std::to_string(e));
    }
  }
}

TEST(GemmFp4, GroupedMaskedLeavesRowsPastCountUntouched) {
  std::mt19937 rng(6);
  ThreadPool pool(2);
  const int64_t n = 200, k = 160, cap = 20;
  const std::vector<int32_t> counts = {0, 1, 20, 4, 0, 17};
  Grouped g = make_grouped(std::vector<int64_t>(counts.size(), 0), n, k, rng);
  const int64_t ne = int64_t(counts.size());
  std::vector<uint16_t> x = random_x(ne * cap, k, rng);
  for (Isa isa : testing::isa_levels()) {
    std::vector<float> y(size_t(ne * cap * n), -7.0f);
    gemm_fp4_grouped_masked(x.data(), k, cap, counts.data(), g.ptrs.data(), ne,
                            GemmOutput{y.data(), DType::kF32, n}, &pool, isa);
    for (int64_t e = 0; e < ne; ++e) {
      const std::string what = std::string(isa_name(isa)) + " expert " + std::to_string(e);
      expect_contract(x.data() + e * cap * k, counts[size_t(e)], k, g.packed[size_t(e)],
                      y.data() + e * cap * n, DType::kF32, n, what);
      for (int64_t i = counts[size_t(e)] * n; i < cap * n; ++i)
        ASSERT_EQ(y[size_t(e * cap * n + i)], -7.0f) << what;
    }
  }
}

TEST(GemmFp4, RowResultsDoNotDependOnM) {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  const int64_t n = 300, k = 384, m = 300;
  Fp4Problem p = make_problem(n, k, rng);
  PackedFp4Weight w = pack(p);
  std::vector<uint16_t> x = random_x(m, k, rng);
  for (Isa isa : testing::isa_levels()) {
    std::vector<float> all(size_t(m * n));
    gemm_fp4(x.data(), m, k, w, GemmOutput{all.data(), DType::kF32, n}, &pool, isa);
    for (auto [r0, rows] : {std::pair<int64_t, int64_t>{0, 1}, {17, 16}, {100, 40}, {299, 1}}) {
      std::vector<float> part(size_t(rows * n));
      gemm_fp4(x.data() + r0 * k, rows, k, w, GemmOutput{part.data(), DType::kF32, n}, nullptr,
               isa);
      EXPECT_EQ(std::memcmp(part.data(), all.data() + r0 * n, part.size() * 4), 0)
          << isa_name(isa) << " rows " << r0 << "+" << rows;
    }
  }
}

}  // namespace
}  // namespace moeserve
