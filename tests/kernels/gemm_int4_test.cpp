// gemm_int4 at every ISA level this CPU has. Two oracles: the contract of gemm_int4.h written out
// here from scratch (every level must give its bits exactly), and the FP8 GEMM's double-precision
// reference, which the INT4 result must meet within the quantization error bound derived below.
#include "kernels/gemm_int4.h"

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
#include "gemm_fp8_problem.h"
#include "kernels/gemm_int8.h"

namespace moeserve {
namespace {

using Problem = testing::Fp8Problem;

std::vector<uint16_t> random_x(int64_t rows, int64_t ld, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<uint16_t> x(size_t(rows * ld));
  for (auto& v : x) v = f32_to_bf16(d(rng));
  return x;
}

float w_value(const Problem& p, int64_t j, int64_t kk) {
  const int64_t kbs = (p.k + 127) / 128;
  return fp8e4m3_to_f32(p.w[size_t(j * p.k + kk)]) * p.scale[size_t((j / 128) * kbs + kk / 128)];
}

// gemm_int4.h's contract for one row (the activations' quantization is gemm_int8's, checked by
// its own tests): y [n] F32.
void contract_row(const uint16_t* x, const PackedInt4Weight& w, float* y) {
  const int64_t kbn = w.k_blocks();
  std::vector<int8_t> q(size_t(kbn * 128));
  std::vector<float> sx(static_cast<size_t>(kbn));
  quantize_row_int8(x, w.k, q.data(), sx.data());
  for (int64_t j = 0; j < w.n; ++j) {
    float tot = 0;
    for (int64_t kb = 0; kb < kbn; ++kb) {
      int32_t dot = 0, sum = 0;
      for (int64_t kk = kb * 128; kk < kb * 128 + 128; ++kk) {
        sum += q[size_t(kk)];
        if (kk < w.k) dot += int32_t(q[size_t(kk)]) * int32_t(w.at(j, kk));
      }
      const float t = std::fma(float(dot), w.scale(j, kb), w.min(j, kb) * float(sum));
      tot = kb == 0 ? t * sx[size_t(kb)] : std::fma(t, sx[size_t(kb)], tot);
    }
    y[j] = tot;
  }
}

void expect_contract(const uint16_t* x, int64_t rows, int64_t ldx, const PackedInt4Weight& w,
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

TEST(GemmInt4, PackRequantizesEachRowAndKBlockAsymmetrically) {
  std::mt19937 rng(1);
  const int64_t n = 130, k = 300;
  Problem p = testing::make_fp8_problem(n, k, rng);
  PackedInt4Weight w = pack_int4_weight(p.w.data(), p.scale.data(), n, k);
  EXPECT_EQ(w.tile_bytes(), size_t(w.n_panels() * w.k_blocks() * 4096));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kb = 0; kb < w.k_blocks(); ++kb) {
      const int64_t k1 = std::min(k, kb * 128 + 128);
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t kk = kb * 128; kk < k1; ++kk) {
        lo = std::min(lo, w_value(p, j, kk));
        hi = std::max(hi, w_value(p, j, kk));
      }
      const float sw = w.scale(j, kb);
      ASSERT_EQ(sw, (hi - lo) / 15.0f) << j << " " << kb;
      ASSERT_EQ(w.min(j, kb), lo);
      int bottom = 15, top = 0;
      for (int64_t kk = kb * 128; kk < k1; ++kk) {
        const int q = w.at(j, kk);
        bottom = std::min(bottom, q);
        top = std::max(top, q);
        // Nearest step: within half a step, plus the roundings of (w - lo) / sw and of sw.
        ASSERT_LE(std::fabs(double(q) * sw + lo - w_value(p, j, kk)), sw * (0.5 + 1e-4))
            << j << " " << kk;
      }
      EXPECT_EQ(bottom, 0) << "the smallest value of a group is step 0";
      EXPECT_EQ(top, 15) << "the largest value of a group is step 15";
      for (int64_t kk = k1; kk < kb * 128 + 128; ++kk) ASSERT_EQ(w.at(j, kk), 0) << "K padding";
    }
  }
  // From the packed FP8 weight: the same bytes and scales.
  PackedInt4Weight w2 = pack_int4_weight(p.packed);
  EXPECT_EQ(std::memcmp(w2.data.get(), w.data.get(), w.tile_bytes()), 0);
  EXPECT_EQ(w2.scales, w.scales);
  // A block of one value: sw = 0, the value in mw.
  std::vector<uint8_t> same(128 * 128, 0x38);  // 1.0
  std::vector<float> one(1, 0.25f);
  PackedInt4Weight c = pack_int4_weight(same.data(), one.data(), 128, 128);
  EXPECT_EQ(c.scale(5, 0), 0.0f);
  EXPECT_EQ(c.min(5, 0), 0.25f);
  EXPECT_EQ(c.at(5, 7), 0);
}

// The lm_head's BF16 weights (--lm-head-dtype int4) requantize the same way, with or without a
// pool (the same bytes), and every level gives the contract's bits on them.
TEST(GemmInt4, Bf16WeightsRequantizeAsFp8Ones) {
  std::mt19937 rng(9);
  const int64_t n = 200, k = 300, m = 17, ldw = k + 8;
  std::vector<uint16_t> wb = random_x(n, ldw, rng);
  auto value = [&](int64_t j, int64_t kk) { return bf16_to_f32(wb[size_t(j * ldw + kk)]); };
  PackedInt4Weight w = pack_int4_weight_bf16(wb.data(), n, k, ldw);
  for (int64_t j = 0; j < n; j += 3) {
    for (int64_t kb = 0; kb < w.k_blocks(); ++kb) {
      const int64_t k1 = std::min(k, kb * 128 + 128);
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t kk = kb * 128; kk < k1; ++kk) {
        lo = std::min(lo, value(j, kk));
        hi = std::max(hi, value(j, kk));
      }
      const float sw = w.scale(j, kb);
      ASSERT_EQ(sw, (hi - lo) / 15.0f) << j << " " << kb;
      ASSERT_EQ(w.min(j, kb), lo);
      for (int64_t kk = kb * 128; kk < k1; ++kk) {
        ASSERT_LE(std::fabs(double(w.at(j, kk)) * sw + lo - value(j, kk)), sw * (0.5 + 1e-4))
            << j << " " << kk;
      }
    }
  }
  ThreadPool pool(2);
  PackedInt4Weight wp = pack_int4_weight_bf16(wb.data(), n, k, ldw, &pool);
  EXPECT_EQ(std::memcmp(wp.data.get(), w.data.get(), w.tile_bytes()), 0);
  EXPECT_EQ(wp.scales, w.scales);
  std::vector<uint16_t> x = random_x(m, k, rng);
  for (Isa isa : testing::isa_levels()) {
    std::vector<float> y(size_t(m * n));
    gemm_int4(x.data(), m, k, w, GemmOutput{y.data(), DType::kF32, n}, &pool, isa);
    expect_contract(x.data(), m, k, w, y.data(), DType::kF32, n, isa_name(isa));
  }
}

// Dense: row counts 1..300, N and K off every grid, F32 and BF16 outputs, every level
// bit-exact to the contract.
TEST(GemmInt4, DenseGivesTheContractsBitsAtEveryLevel) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  struct Shape {
    int64_t n, k;
  };
  for (Shape s : {Shape{64, 128}, Shape{130, 257}, Shape{200, 64}, Shape{67, 520}}) {
    Problem p = testing::make_fp8_problem(s.n, s.k, rng);
    PackedInt4Weight w = pack_int4_weight(p.w.data(), p.scale.data(), s.n, s.k);
    for (int64_t m : {1, 2, 5, 6, 7, 16, 17, 33, 64, 65, 129, 300}) {
      const int64_t ldx = s.k + 3;
      std::vector<uint16_t> x = random_x(m, ldx, rng);
      for (Isa isa : testing::isa_levels()) {
        for (DType dt : {DType::kF32, DType::kBF16}) {
          std::vector<uint8_t> y(size_t(m * s.n) * dtype_size(dt));
          gemm_int4(x.data(), m, ldx, w, GemmOutput{y.data(), dt, s.n}, &pool, isa);
          expect_contract(x.data(), m, ldx, w, y.data(), dt, s.n,
                          std::string(isa_name(isa)) + " " + dtype_name(dt) +
                              " m=" + std::to_string(m) + " n=" + std::to_string(s.n) +
                              " k=" + std::to_string(s.k));
        }
      }
    }
  }
}

// The INT4 result against the FP8 GEMM's exact (double) value. With x = sx qx + ex, |ex| <=
// sx/2, and w = sw qw + mw + ew, |ew| <= sw/2, per product |x w - sx qx (sw qw + mw)| <= |x|
// sw/2 + (sx/2)(|w| + sw/2); summed over k, plus F32 roundings of the promotion (4 per K
// block, 2^-24 each, of the magnitude sum).
TEST(GemmInt4, WithinTheQuantizationBoundOfTheFp8Reference) {
  std::mt19937 rng(4);
  ThreadPool pool(2);
  const int64_t n = 150, k = 700, m = 40;
  Problem p = testing::make_fp8_problem(n, k, rng);
  PackedInt4Weight w = pack_int4_weight(p.w.data(), p.scale.data(), n, k);
  std::vector<uint16_t> x = random_x(m, k, rng);
  std::vector<float> ref(size_t(m * n)), y(size_t(m * n));
  gemm_fp8_ref(x.data(), m, k, p.w.data(), p.scale.data(), n, k, ref.data());
  gemm_int4(x.data(), m, k, w, GemmOutput{y.data(), DType::kF32, n}, &pool);
  std::vector<int8_t> q(size_t(w.k_blocks() * 128));
  std::vector<float> sx(static_cast<size_t>(w.k_blocks()));
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    quantize_row_int8(&x[size_t(i * k)], k, q.data(), sx.data());
    for (int64_t j = 0; j < n; ++j) {
      double bound = 0, mag = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double xv = std::fabs(bf16_to_f32(x[size_t(i * k + kk)]));
        const double wv = std::fabs(w_value(p, j, kk));
        const double a = sx[size_t(kk / 128)], b = w.scale(j, kk / 128);
        bound += xv * b / 2 + a / 2 * (wv + b / 2);
        mag += xv * (wv + b);
      }
      bound += 4 * w.k_blocks() * std::ldexp(mag + bound, -24);
      const double err = std::fabs(double(y[size_t(i * n + j)]) - ref[size_t(i * n + j)]);
      ASSERT_LE(err, bound) << i << " " << j;
      worst = std::max(worst, err / bound);
    }
  }
  EXPECT_LT(worst, 0.5);  // errors that cancel stay well inside the worst case
}

struct Grouped {
  std::vector<Problem> problems;
  std::vector<PackedInt4Weight> packed;
  std::vector<const PackedInt4Weight*> ptrs;
  std::vector<int64_t> off;
};

Grouped make_grouped(const std::vector<int64_t>& rows, int64_t n, int64_t k, std::mt19937& rng) {
  Grouped g;
  for (size_t e = 0; e < rows.size(); ++e)
    g.problems.push_back(testing::make_fp8_problem(n, k, rng));
  for (auto& p : g.problems) g.packed.push_back(pack_int4_weight(p.w.data(), p.scale.data(), n, k));
  for (auto& w : g.packed) g.ptrs.push_back(&w);
  g.off.assign(rows.size() + 1, 0);
  for (size_t e = 0; e < rows.size(); ++e) g.off[e + 1] = g.off[e] + rows[e];
  return g;
}

TEST(GemmInt4, GroupedContiguousAndGatherWithEmptyAndOneRowExperts) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  const int64_t n = 130, k = 257, tokens = 30;
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
    gemm_int4_grouped_contiguous(copied.data(), k, g.off.data(), g.ptrs.data(),
                                 int64_t(rows.size()), GemmOutput{y.data(), DType::kF32, n}, &pool,
                                 isa);
    gemm_int4_grouped_contiguous_gather(token_rows.data(), ldx, src.data(), g.off.data(),
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

TEST(GemmInt4, GroupedMaskedLeavesRowsPastCountUntouched) {
  std::mt19937 rng(6);
  ThreadPool pool(2);
  const int64_t n = 200, k = 129, cap = 20;
  const std::vector<int32_t> counts = {0, 1, 20, 4, 0, 17};
  Grouped g = make_grouped(std::vector<int64_t>(counts.size(), 0), n, k, rng);
  const int64_t ne = int64_t(counts.size());
  std::vector<uint16_t> x = random_x(ne * cap, k, rng);
  for (Isa isa : testing::isa_levels()) {
    std::vector<float> y(size_t(ne * cap * n), -7.0f);
    gemm_int4_grouped_masked(x.data(), k, cap, counts.data(), g.ptrs.data(), ne,
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

TEST(GemmInt4, RowResultsDoNotDependOnM) {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  const int64_t n = 300, k = 384, m = 300;
  Problem p = testing::make_fp8_problem(n, k, rng);
  PackedInt4Weight w = pack_int4_weight(p.w.data(), p.scale.data(), n, k);
  std::vector<uint16_t> x = random_x(m, k, rng);
  for (Isa isa : testing::isa_levels()) {
    std::vector<float> all(size_t(m * n));
    gemm_int4(x.data(), m, k, w, GemmOutput{all.data(), DType::kF32, n}, &pool, isa);
    for (auto [r0, rows] : {std::pair<int64_t, int64_t>{0, 1}, {17, 16}, {100, 40}, {299, 1}}) {
      std::vector<float> part(size_t(rows * n));
      gemm_int4(x.data() + r0 * k, rows, k, w, GemmOutput{part.data(), DType::kF32, n}, nullptr,
                isa);
      EXPECT_EQ(std::memcmp(part.data(), all.data() + r0 * n, part.size() * 4), 0)
          << isa_name(isa) << " rows " << r0 << "+" << rows;
    }
  }
}

}  // namespace
}  // namespace moeserve
