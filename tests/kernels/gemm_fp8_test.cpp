// gemm_fp8 at every ISA level this CPU has, against the double-precision reference on the
// checkpoint layout: dense, grouped-contiguous and grouped-masked, F32 and BF16 outputs, shapes
// with N and K off the 128 grid, odd K, empty experts and one-row experts.
#include "kernels/gemm_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

std::vector<uint16_t> random_x(int64_t rows, int64_t ld, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<uint16_t> x(size_t(rows * ld));
  for (auto& v : x) {
    float f;
    do f = d(rng);
    while (std::fabs(f) < 1e-3f);
    v = f32_to_bf16(f);
  }
  return x;
}

// Sum of |x * w * s| for row i, column j: the scale of the rounding error of an FP32 sum.
double magnitude(const uint16_t* x, const Problem& p, int64_t j) {
  double m = 0;
  int64_t kbs = (p.k + 127) / 128;
  for (int64_t kk = 0; kk < p.k; ++kk) {
    m += std::fabs(double(bf16_to_f32(x[kk])) * fp8e4m3_to_f32(p.w[size_t(j * p.k + kk)]) *
                   p.scale[size_t((j / 128) * kbs + kk / 128)]);
  }
  return m;
}

// Checks rows [0, rows) of y (row stride ldy) against the reference for X rows x (stride ldx).
void expect_matches(const uint16_t* x, int64_t rows, int64_t ldx, const Problem& p, const void* y,
                    DType dt, int64_t ldy, const std::string& what) {
  std::vector<float> ref(size_t(rows * p.n));
  gemm_fp8_ref(x, rows, ldx, p.w.data(), p.scale.data(), p.n, p.k, ref.data());
  int failures = 0;
  for (int64_t i = 0; i < rows && failures < 5; ++i) {
    for (int64_t j = 0; j < p.n && failures < 5; ++j) {
      double got = dt == DType::kF32 ? static_cast<const float*>(y)[i * ldy + j]
                                     : bf16_to_f32(static_cast<const uint16_t*>(y)[i * ldy + j]);
      double want = ref[size_t(i * p.n + j)];
      // FP32 accumulation: a few ulps of the magnitude per 128-block sum and across blocks.
      double tol = 4e-6 * magnitude(x + i * ldx, p, j) + 1e-30;
      if (dt == DType::kBF16) tol += std::fabs(want) * (1.0 / 256);
      if (!(std::fabs(got - want) <= tol)) {
        ADD_FAILURE() << what << " row " << i << " col " << j << ": got " << got << " want " << want
                      << " tol " << tol;
        ++failures;
      }
    }
  }
}

TEST(GemmFp8, PackRoundTripsEveryByte) {
  std::mt19937 rng(1);
  Problem p = make_problem(200, 513, rng);
  for (int64_t i = 0; i < p.n; ++i)
    for (int64_t j = 0; j < p.k; ++j) ASSERT_EQ(p.packed.at(i, j), p.w[size_t(i * p.k + j)]);
}

TEST(GemmFp8, DenseMatchesReferenceAtEveryLevel) {
  std::mt19937 rng(2);
  ThreadPool pool(2);
  struct Shape {
    int64_t n, k;
  };
  const Shape shapes[] = {{1, 1},     {7, 129},  {129, 7},  {200, 513},
                          {513, 200}, {64, 256}, {130, 255}};
  const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 13, 37, 300};
  for (const Shape& s : shapes) {
    Problem p = make_problem(s.n, s.k, rng);
    for (int64_t m : ms) {
      if (s.n * s.k * m > 4'000'000) continue;  // keep the double reference fast
      int64_t ldx = s.k + 3;
      std::vector<uint16_t> x = random_x(m, ldx, rng);
      for (Isa isa : testing::isa_levels()) {
        for (DType dt : {DType::kF32, DType::kBF16}) {
          int64_t ldy = s.n + 5;
          std::vector<uint8_t> y(size_t(m * ldy) * dtype_size(dt), 0xcd);
          gemm_fp8(x.data(), m, ldx, p.packed, GemmOutput{y.data(), dt, ldy},
                   (m & 1) ? &pool : nullptr, isa);
          std::string what = std::string(isa_name(isa)) + " " + dtype_name(dt) +
                             " m=" + std::to_string(m) + " n=" + std::to_string(s.n) +
                             " k=" + std::to_string(s.k);
          expect_matches(x.data(), m, ldx, p, y.data(), dt, ldy, what);
          // Padding columns between n and ldy stay untouched.
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = s.n * int64_t(dtype_size(dt)); j < ldy * int64_t(dtype_size(dt)); ++j)
              ASSERT_EQ(y[size_t(i * ldy) * dtype_size(dt) + size_t(j)], 0xcd) << what;
        }
      }
    }
  }
}

TEST(GemmFp8, SampledRowCountsUpTo300) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  Problem p = make_problem(72, 200, rng);
  std::uniform_int_distribution<int64_t> mdist(1, 300);
  for (int trial = 0; trial < 12; ++trial) {
    int64_t m = mdist(rng);
    std::vector<uint16_t> x = random_x(m, p.k, rng);
    for (Isa isa : testing::isa_levels()) {
      std::vector<float> y(size_t(m * p.n));
      gemm_fp8(x.data(), m, p.k, p.packed, GemmOutput{y.data(), DType::kF32, p.n}, &pool, isa);
      expect_matches(x.data(), m, p.k, p, y.data(), DType::kF32, p.n,
                     std::string(isa_name(isa)) + " m=" + std::to_string(m));
    }
  }
}

// The AVX-512F and AVX2 levels are one body (gemm_fp8_fma_body.h) on zmm and ymm with different
// register blocks but the same FMAs per output: the same bits, F32 and BF16 out, over row counts
// around both blocks (6 and 4 rows) and N, K off the 64 and 128 grids.
TEST(GemmFp8, Avx512fAndAvx2LevelsGiveTheSameBits) {
  if (!isa_at_most(Isa::kAvx512, cpu_isa())) GTEST_SKIP() << "needs AVX-512F";
  std::mt19937 rng(11);
  ThreadPool pool(2);
  Problem p = make_problem(200, 300, rng);
  for (int64_t m : {1, 3, 4, 5, 6, 7, 13, 50}) {
    std::vector<uint16_t> x = random_x(m, p.k, rng);
    for (DType dt : {DType::kF32, DType::kBF16}) {
      std::vector<uint32_t> y512(size_t(m * p.n)), y2(y512.size());  // raw bits of either type
      gemm_fp8(x.data(), m, p.k, p.packed, GemmOutput{y512.data(), dt, p.n}, &pool, Isa::kAvx512);
      gemm_fp8(x.data(), m, p.k, p.packed, GemmOutput{y2.data(), dt, p.n}, &pool, Isa::kAvx2);
      ASSERT_EQ(y512, y2) << "m=" << m << " " << dtype_name(dt);
    }
  }
}

// K long enough that the AVX-512 BF16 kernel takes its K blocks in several chunks (16 blocks
// each), the last one partial and ending in a partial block, with several row blocks, and more
// rows than one block of X (1024 at most): matches the reference, and a row's bits do not depend
// on the rows that ran with it (windows of a 1100-row run, one across the row-block boundary,
// against runs of the window alone).
TEST(GemmFp8, LongKAcrossChunks) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  const int64_t rows = 1100;
  for (int64_t k : {int64_t(16 * 128), int64_t(2 * 16 * 128 + 77)}) {
    Problem p = make_problem(70, k, rng);
    std::vector<uint16_t> x = random_x(rows, k, rng);
    for (Isa isa : testing::isa_levels()) {
      std::vector<float> all(size_t(rows * p.n));
      gemm_fp8(x.data(), rows, k, p.packed, GemmOutput{all.data(), DType::kF32, p.n}, &pool, isa);
      const std::string at = std::string(isa_name(isa)) + " k=" + std::to_string(k);
      expect_matches(x.data(), 37, k, p, all.data(), DType::kF32, p.n, at);
      struct Window {
        int64_t r0, m;
      };
      for (Window w :
           {Window{0, 37}, Window{0, 1}, Window{0, 7}, Window{530, 40}, Window{rows - 13, 13}}) {
        std::vector<float> y(size_t(w.m * p.n));
        gemm_fp8(x.data() + w.r0 * k, w.m, k, p.packed, GemmOutput{y.data(), DType::kF32, p.n},
                 (w.m & 1) ? &pool : nullptr, isa);
        for (int64_t i = 0; i < w.m * p.n; ++i)
          ASSERT_TRUE(testing::same_bits(y[size_t(i)], all[size_t(w.r0 * p.n + i)]))
              << at << " rows " << w.r0 << "+" << w.m << " at " << i;
      }
    }
  }
}

// Experts of one shape with rows[e] rows each in the contiguous layout: the problems, pointers
// to their packed weights, and the segment offsets [experts + 1].
struct Grouped {
  std::vector<Problem> ex;
  std::vector<const PackedFp8Weight*> ptrs;
  std::vector<int64_t> off;
};
Grouped make_grouped(const std::vector<int64_t>& rows, int64_t n, int64_t k, std::mt19937& rng) {
  Grouped g;
  for (size_t e = 0; e < rows.size(); ++e) g.ex.push_back(make_problem(n, k, rng));
  for (auto& e : g.ex) g.ptrs.push_back(&e.packed);  // (ex no longer grows)
  g.off.assign(rows.size() + 1, 0);
  for (size_t e = 0; e < rows.size(); ++e) g.off[e + 1] = g.off[e] + rows[e];
  return g;
}

TEST(GemmFp8, GroupedContiguousWithEmptyAndOneRowExperts) {
  std::mt19937 rng(4);
  ThreadPool pool(2);
  const int64_t n = 130, k = 257;
  const std::vector<int64_t> rows = {3, 0, 1, 17, 0, 0, 1, 40};  // per expert
  const auto [ex, ptrs, off] = make_grouped(rows, n, k, rng);
  const int64_t total = off.back();
  std::vector<uint16_t> x = random_x(total, k, rng);
  for (Isa isa : testing::isa_levels()) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      std::vector<uint8_t> y(size_t(total * n) * dtype_size(dt));
      gemm_fp8_grouped_contiguous(x.data(), k, off.data(), ptrs.data(), int64_t(ptrs.size()),
                                  GemmOutput{y.data(), dt, n}, &pool, isa);
      for (size_t e = 0; e < rows.size(); ++e) {
        if (rows[e] == 0) continue;
        expect_matches(x.data() + off[e] * k, rows[e], k, ex[e],
                       y.data() + size_t(off[e] * n) * dtype_size(dt), dt, n,
                       std::string(isa_name(isa)) + " expert " + std::to_string(e));
      }
    }
  }
}

// Rows gathered by index (a token's row read by each of its experts) give the same bits as the
// same rows copied into the contiguous layout, at every level; with more rows than one thread's
// share so that both threads gather.
TEST(GemmFp8, GroupedContiguousGatherEqualsTheCopiedRows) {
  std::mt19937 rng(14);
  ThreadPool pool(2);
  const int64_t n = 200, k = 300, tokens = 23;
  const std::vector<int64_t> rows = {5, 0, 1, 30, 2, 0, 9};  // per expert
  const auto [ex, ptrs, off] = make_grouped(rows, n, k, rng);
  const int64_t total = off.back(), ldx = k + 5;
  std::vector<uint16_t> token_rows = random_x(tokens, ldx, rng);  // [tokens, ldx]
  std::uniform_int_distribution<int32_t> pick(0, int32_t(tokens - 1));
  std::vector<int32_t> src(static_cast<size_t>(total));
  std::vector<uint16_t> copied(size_t(total * k));  // [total, k]
  for (int64_t i = 0; i < total; ++i) {
    src[size_t(i)] = pick(rng);
    std::copy_n(&token_rows[size_t(src[size_t(i)] * ldx)], k, &copied[size_t(i * k)]);
  }
  for (Isa isa : testing::isa_levels()) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const size_t bytes = size_t(total * n) * dtype_size(dt);
      std::vector<uint8_t> want(bytes), got(bytes);
      gemm_fp8_grouped_contiguous(copied.data(), k, off.data(), ptrs.data(), int64_t(ptrs.size()),
                                  GemmOutput{want.data(), dt, n}, &pool, isa);
      gemm_fp8_grouped_contiguous_gather(token_rows.data(), ldx, src.data(), off.data(),
                                         ptrs.data(), int64_t(ptrs.size()),
                                         GemmOutput{got.data(), dt, n}, &pool, isa);
      EXPECT_EQ(got, want) << isa_name(isa) << " " << dtype_name(dt);
      // And it is right, not merely equal: expert 3 against the reference.
      expect_matches(copied.data() + off[3] * k, rows[3], k, ex[3],
                     got.data() + size_t(off[3] * n) * dtype_size(dt), dt, n,
                     std::string(isa_name(isa)) + " gathered expert 3");
    }
  }
}

// A gathered expert of more rows than a thread copies together at a time (1024): the copies in
// pieces give the bits of the whole contiguous job.
TEST(GemmFp8, GroupedGatherOfAnExpertOverTheCopyLimit) {
  std::mt19937 rng(16);
  ThreadPool pool(2);
  const int64_t n = 70, k = 130, tokens = 40;
  const std::vector<int64_t> rows = {3, 1100, 2};
  const auto [ex, ptrs, off] = make_grouped(rows, n, k, rng);
  const int64_t total = off.back();
  std::vector<uint16_t> token_rows = random_x(tokens, k, rng);  // [tokens, k]
  std::uniform_int_distribution<int32_t> pick(0, int32_t(tokens - 1));
  std::vector<int32_t> src(static_cast<size_t>(total));
  std::vector<uint16_t> copied(size_t(total * k));
  for (int64_t i = 0; i < total; ++i) {
    src[size_t(i)] = pick(rng);
    std::copy_n(&token_rows[size_t(src[size_t(i)] * k)], k, &copied[size_t(i * k)]);
  }
  for (Isa isa : testing::isa_levels()) {
    std::vector<float> want(size_t(total * n)), got(size_t(total * n));
    gemm_fp8_grouped_contiguous(copied.data(), k, off.data(), ptrs.data(), int64_t(ptrs.size()),
                                GemmOutput{want.data(), DType::kF32, n}, &pool, isa);
    gemm_fp8_grouped_contiguous_gather(token_rows.data(), k, src.data(), off.data(), ptrs.data(),
                                       int64_t(ptrs.size()), GemmOutput{got.data(), DType::kF32, n},
                                       &pool, isa);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << isa_name(isa);
  }
}

TEST(GemmFp8, GroupedMaskedLeavesRowsPastCountUntouched) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  const int64_t n = 200, k = 129, cap = 9;
  const std::vector<int32_t> counts = {0, 1, 9, 4, 0, 2};
  std::vector<Problem> ex;
  std::vector<const PackedFp8Weight*> ptrs;
  for (size_t e = 0; e < counts.size(); ++e) ex.push_back(make_problem(n, k, rng));
  for (auto& e : ex) ptrs.push_back(&e.packed);
  const int64_t ne = int64_t(counts.size());
  std::vector<uint16_t> x = random_x(ne * cap, k, rng);
  for (Isa isa : testing::isa_levels()) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const size_t es = dtype_size(dt);
      std::vector<uint8_t> y(size_t(ne * cap * n) * es, 0xab);
      gemm_fp8_grouped_masked(x.data(), k, cap, counts.data(), ptrs.data(), ne,
                              GemmOutput{y.data(), dt, n}, &pool, isa);
      for (int64_t e = 0; e < ne; ++e) {
        std::string what = std::string(isa_name(isa)) + " expert " + std::to_string(e);
        if (counts[size_t(e)] > 0) {
          expect_matches(x.data() + e * cap * k, counts[size_t(e)], k, ex[size_t(e)],
                         y.data() + size_t(e * cap * n) * es, dt, n, what);
        }
        for (int64_t i = counts[size_t(e)]; i < cap; ++i)
          for (size_t b = 0; b < size_t(n) * es; ++b)
            ASSERT_EQ(y[size_t((e * cap + i) * n) * es + b], 0xab) << what << " row " << i;
      }
    }
  }
}

// Every FP8 byte (subnormals and both zeros included) times one-hot X must come out exact.
TEST(GemmFp8, EveryFp8ValueConvertsExactly) {
  const int64_t n = 256, k = 128;
  std::vector<uint8_t> w(size_t(n * k));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) w[size_t(i * k + j)] = uint8_t((i + j) & 0xff);
  for (auto& b : w)
    if ((b & 0x7f) == 0x7f) b = 0x7e;  // NaN is not a weight
  std::vector<float> scale(2, 1.0f);
  PackedFp8Weight p = pack_fp8_weight(w.data(), scale.data(), n, k);
  for (int64_t col : {0, 1, 5, 127}) {
    std::vector<uint16_t> x(size_t(k), 0);
    x[size_t(col)] = f32_to_bf16(1.0f);
    for (Isa isa : testing::isa_levels()) {
      std::vector<float> y(static_cast<size_t>(n));
      gemm_fp8(x.data(), 1, k, p, GemmOutput{y.data(), DType::kF32, n}, nullptr, isa);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(y[size_t(i)], fp8e4m3_to_f32(w[size_t(i * k + col)]))
            << isa_name(isa) << " byte " << int(w[size_t(i * k + col)]);
    }
  }
}


// The AMX level by name, so a machine without it says so (every test above runs it where the
// CPU has it, through isa_levels()). Bound: the tile unit sums each 128-wide K block in F32 in
// its own order, so per block the error is at most 128 ulps of the block's magnitude; the
// promotion adds one rounding per block, so 4e-6 x the row's magnitude (67 ulps) holds with
// room to spare at these K, as for the AVX-512 level. Shapes cross every path of the kernel:
// a partial last row tile (M = 1, 17, 40, 65), several row groups (65, 130), K in chunks
// (K = 4100 at 130 rows: 16 + 16 + 1 K blocks), panels in sweeps (1024 rows, N = 520: sweeps
// of 8 panels, chunks of 4 K blocks), N off the 64-column grid, and BF16 output.
TEST(GemmFp8Amx, MatchesReferenceOnEveryPath) {
  if (cpu_isa() != Isa::kAmx) GTEST_SKIP() << "skipped: no AMX";
  std::mt19937 rng(21);
  ThreadPool pool(2);
  struct Case {
    int64_t n, k;
    std::vector<int64_t> ms;
  };
  for (const Case& c : {Case{200, 4100, {1, 17, 40, 65, 130}}, Case{97, 300, {1, 17, 40}},
                        Case{520, 520, {1024}}}) {
    const int64_t n = c.n, k = c.k;
    Problem p = make_problem(n, k, rng);
    for (int64_t m : c.ms) {
      std::vector<uint16_t> x = random_x(m, k, rng);
      for (DType dt : {DType::kF32, DType::kBF16}) {
        std::vector<uint8_t> y(size_t(m * n) * dtype_size(dt));
        gemm_fp8(x.data(), m, k, p.packed, GemmOutput{y.data(), dt, n}, &pool, Isa::kAmx);
        // (At 1024 rows, the first and last 48 against the reference, to keep it fast.)
        for (int64_t r0 : m > 200 ? std::vector<int64_t>{0, m - 48} : std::vector<int64_t>{0}) {
          const int64_t rows = m > 200 ? 48 : m;
          expect_matches(x.data() + r0 * k, rows, k, p, y.data() + size_t(r0 * n) * dtype_size(dt),
                         dt, n, "amx m=" + std::to_string(m) + " k=" + std::to_string(k));
        }
      }
    }
  }
}

// At the AMX level one-row jobs (batch-1 decode) run vector code that sums each K block as
// TDPBF16PS does (docs/kernels-amx.md, "Numerics"); the tile unit runs the rest. A row must get
// the same bits either way, or greedy outputs would depend on batching: every row of a 40-row
// tile-unit run against the same row alone, FP8 (K off the grid, across chunks, with zeros in
// X, F32 and BF16 outputs), BF16 packed weights (the lm_head), and grouped-masked experts of one
// row against the same rows in a dense run.
TEST(GemmFp8Amx, OneRowJobsGiveTheTileUnitsBits) {
  if (cpu_isa() != Isa::kAmx) GTEST_SKIP() << "skipped: no AMX";
  std::mt19937 rng(23);
  ThreadPool pool(2);
  const int64_t m = 40;
  for (int64_t k : {int64_t(300), int64_t(2 * 16 * 128 + 77)}) {
    const int64_t n = 200;
    Problem p = make_problem(n, k, rng);
    std::vector<uint16_t> x = random_x(m, k, rng);
    for (int64_t i = 0; i < m * k; i += 7) x[size_t(i)] = 0;
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const size_t es = dtype_size(dt);
      std::vector<uint8_t> all(size_t(m * n) * es), one(size_t(n) * es);
      gemm_fp8(x.data(), m, k, p.packed, GemmOutput{all.data(), dt, n}, &pool, Isa::kAmx);
      for (int64_t r = 0; r < m; ++r) {
        gemm_fp8(x.data() + r * k, 1, k, p.packed, GemmOutput{one.data(), dt, n}, &pool,
                 Isa::kAmx);
        ASSERT_EQ(std::memcmp(one.data(), all.data() + size_t(r * n) * es, one.size()), 0)
            << "k=" << k << " row " << r << (dt == DType::kBF16 ? " bf16" : " f32");
      }
    }
    // The same rows as one-row experts of the masked layout (capacity 2, the second row unused).
    const int64_t ne = 5, cap = 2;
    std::vector<const PackedFp8Weight*> ptrs(size_t(ne), &p.packed);
    std::vector<int32_t> counts(size_t(ne), 1);
    std::vector<uint16_t> xm(size_t(ne * cap * k), 0);
    for (int64_t e = 0; e < ne; ++e)
      std::memcpy(xm.data() + e * cap * k, x.data() + (3 * e) * k, size_t(k) * 2);
    std::vector<float> ym(size_t(ne * cap * n)), all(size_t(m * n));
    gemm_fp8(x.data(), m, k, p.packed, GemmOutput{all.data(), DType::kF32, n}, &pool, Isa::kAmx);
    gemm_fp8_grouped_masked(xm.data(), k, cap, counts.data(), ptrs.data(), ne,
                            GemmOutput{ym.data(), DType::kF32, n}, &pool, Isa::kAmx);
    for (int64_t e = 0; e < ne; ++e)
      for (int64_t j = 0; j < n; ++j)
        ASSERT_TRUE(testing::same_bits(ym[size_t(e * cap * n + j)], all[size_t(3 * e * n + j)]))
            << "masked k=" << k << " expert " << e << " col " << j;
  }
  // BF16 weights, read in place by both paths.
  for (int64_t k : {int64_t(200), int64_t(2048 + 64)}) {
    const int64_t n = 150;
    std::vector<uint16_t> w = random_x(n, k, rng), x = random_x(m, k, rng);
    PackedBf16Weight pw = pack_bf16_weight(w.data(), n, k, k, &pool);
    std::vector<float> all(size_t(m * n)), one(static_cast<size_t>(n));
    gemm_bf16_packed(x.data(), m, k, pw, all.data(), n, &pool, Isa::kAmx);
    for (int64_t r = 0; r < m; ++r) {
      gemm_bf16_packed(x.data() + r * k, 1, k, pw, one.data(), n, &pool, Isa::kAmx);
      for (int64_t j = 0; j < n; ++j)
        ASSERT_TRUE(testing::same_bits(one[size_t(j)], all[size_t(r * n + j)]))
            << "bf16 weights k=" << k << " row " << r << " col " << j;
    }
  }
}

}  // namespace
}  // namespace moeserve
