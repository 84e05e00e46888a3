#include "kernels/gemm_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "kernels/gemm_fp8.h"

namespace moeserve {
namespace {

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

TEST(GemmBf16, EveryIsaMatchesReference) {
  std::mt19937 rng(11);
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{1, 37, 200}, Shape{3, 64, 31}, Shape{5, 129, 513},
                  Shape{17, 7, 4096}, Shape{4, 300, 64}}) {
    int64_t ldx = s.k + 3, ldw = s.k + 5, ldy = s.n + 2;
    auto x = random_bf16(size_t(s.m * ldx), rng);
    auto w = random_bf16(size_t(s.n * ldw), rng);
    std::vector<float> want(size_t(s.m * ldy), -7.0f);
    gemm_bf16_ref(x.data(), s.m, ldx, w.data(), s.n, s.k, ldw, want.data(), ldy);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx}) {
      if (!isa_at_most(isa, cpu_isa())) continue;
      ThreadPool pool(2);
      std::vector<float> got(size_t(s.m * ldy), -7.0f);
      gemm_bf16(x.data(), s.m, ldx, w.data(), s.n, s.k, ldw, got.data(), ldy, &pool, isa);
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < ldy; ++j) {
          float a = got[size_t(i * ldy + j)], b = want[size_t(i * ldy + j)];
          if (j >= s.n) {
            EXPECT_EQ(a, -7.0f) << "wrote past n";
            continue;
          }
          // Different summation order: tolerance relative to sqrt(k) * |terms| ~ 1.
          EXPECT_NEAR(a, b, 1e-4f * std::sqrt(float(s.k)) * 4)
              << isa_name(isa) << " m=" << s.m << " n=" << s.n << " k=" << s.k;
        }
      }
    }
  }
}

// The tiled layout: every element lands where at() says, for shapes with partial panels/blocks.
TEST(GemmBf16Packed, PackPlacesEveryElement) {
  std::mt19937 rng(3);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {65, 129}, {130, 300}}) {
    const int64_t ldw = k + 1;
    auto w = random_bf16(size_t(n * ldw), rng);
    ThreadPool pool(2);
    PackedBf16Weight p = pack_bf16_weight(w.data(), n, k, ldw, &pool);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c)
        ASSERT_EQ(p.at(r, c), w[size_t(r * ldw + c)]) << r << "," << c;
  }
}

// Against the reference on random data at every ISA level (below AVX-512 BF16: the F32 kernels
// on exactly converted tiles), M = 1..300 sampled (every register-block remainder), N and K not
// multiples of 64/128; a row's result must not depend on M (batch invariance) or on the thread
// count.
TEST(GemmBf16Packed, MatchesReferenceAndIsBatchInvariant) {
  std::mt19937 rng(17);
  struct Shape {
    int64_t n, k;
  };
  for (Shape s : {Shape{1, 1}, Shape{37, 200}, Shape{64, 128}, Shape{129, 513}, Shape{300, 31},
                  Shape{70, 2 * 16 * 128 + 77}}) {
    const int64_t max_m = 300, ldx = s.k + 3, ldy = s.n + 2;
    auto x = random_bf16(size_t(max_m * ldx), rng);
    auto w = random_bf16(size_t(s.n * s.k), rng);
    PackedBf16Weight p = pack_bf16_weight(w.data(), s.n, s.k, s.k);
    std::vector<float> want(size_t(max_m * ldy));
    gemm_bf16_ref(x.data(), max_m, ldx, w.data(), s.n, s.k, s.k, want.data(), ldy);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx}) {
      if (!isa_at_most(isa, cpu_isa())) continue;
      std::vector<float> first;  // rows of the m = 300 run, for the invariance check
      for (int64_t m : {300, 1, 2, 5, 6, 7, 13, 64, 127}) {
        ThreadPool pool(m % 2 ? 1 : 2);
        std::vector<float> got(size_t(m * ldy), -7.0f);
        gemm_bf16_packed(x.data(), m, ldx, p, got.data(), ldy, &pool, isa);
        if (first.empty()) first = got;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < ldy; ++j) {
            float a = got[size_t(i * ldy + j)];
            if (j >= s.n) {
              ASSERT_EQ(a, -7.0f) << "wrote past n";
              continue;
            }
            ASSERT_NEAR(a, want[size_t(i * ldy + j)], 1e-4f * std::sqrt(float(s.k)) * 4)
                << isa_name(isa) << " m=" << m << " n=" << s.n << " k=" << s.k;
            ASSERT_EQ(a, first[size_t(i * ldy + j)]) << "row " << i << " changed with m=" << m;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

TEST(GemmF32, EveryIsaMatchesScalar) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 5, 3}, {6, 33, 17}, {9, 128, 160}, {2, 7, 512}}) {
    std::vector<float> x(size_t(m * k)), w(size_t(n * k));
    for (auto& v : x) v = d(rng);
    for (auto& v : w) v = d(rng);
    std::vector<float> want(size_t(m * n)), got(size_t(m * n));
    gemm_f32(x.data(), m, k, w.data(), n, k, k, want.data(), n, nullptr, Isa::kScalar);
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx}) {
      if (!isa_at_most(isa, cpu_isa())) continue;
      ThreadPool pool(2);
      gemm_f32(x.data(), m, k, w.data(), n, k, k, got.data(), n, &pool, isa);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-5f * std::sqrt(float(k)) * 4) << isa_name(isa);
      }
    }
  }
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

// gemm_f32_bf16w reads BF16 weights where gemm_f32 reads their F32 copy: the same bits at every
// level, thread count and row count (a decode router's one row, a prefill's many), tails of K
// included.
TEST(GemmF32Bf16w, GivesGemmF32sBitsOnTheWidenedWeights) {
  std::mt19937 rng(6);
  std::normal_distribution<float> d(0.0f, 1.0f);
  ThreadPool pool(2);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 2048},
                         {1, 5, 3},
                         {3, 256, 2053},
                         {40, 7, 512},
                         {9, 33, 17}}) {
    std::vector<float> x(size_t(m * k)), wf(size_t(n * k));
    std::vector<uint16_t> wb(size_t(n * k));
    for (auto& v : x) v = d(rng);
    for (size_t i = 0; i < wb.size(); ++i) {
      wb[i] = f32_to_bf16(d(rng));
      wf[i] = bf16_to_f32(wb[i]);
    }
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx}) {
      if (!isa_at_most(isa, cpu_isa())) continue;
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> want(size_t(m * n)), got(size_t(m * n));
        gemm_f32(x.data(), m, k, wf.data(), n, k, k, want.data(), n, p, isa);
        gemm_f32_bf16w(x.data(), m, k, wb.data(), n, k, k, got.data(), n, p, isa);
        EXPECT_EQ(got, want) << isa_name(isa) << " m=" << m << " n=" << n << " k=" << k;
      }
    }
  }
}

TEST(GemmF32Kn, EveryIsaMatchesScalar) {
  std::mt19937 rng(6);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 5, 3},
                         {6, 33, 17},
                         {9, 160, 48},
                         {5, 512, 128},
                         {70, 40, 160},
                         {3, 200, 7},
                         {32, 128, 512},
                         {13, 576, 64}}) {
    const int64_t ldx = k + 1, ldwt = n + 3, ldy = n + 2;
    std::vector<float> x(size_t(m * ldx)), wt(size_t(k * ldwt));
    for (auto& v : x) v = d(rng);
    for (auto& v : wt) v = d(rng);
    std::vector<float> want(size_t(m * ldy), -9.0f), got(size_t(m * ldy), -9.0f);
    gemm_f32_kn(x.data(), m, ldx, wt.data(), n, k, ldwt, want.data(), ldy, nullptr, Isa::kScalar);
    for (Isa isa : {Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx}) {
      if (!isa_at_most(isa, cpu_isa())) continue;
      ThreadPool pool(2);
      gemm_f32_kn(x.data(), m, ldx, wt.data(), n, k, ldwt, got.data(), ldy, &pool, isa);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < ldy; ++j) {
          float a = got[size_t(i * ldy + j)], b = want[size_t(i * ldy + j)];
          if (j >= n) {
            EXPECT_EQ(a, -9.0f) << "wrote past n";
          } else {
            EXPECT_NEAR(a, b, 1e-5f * std::sqrt(float(k)) * 4) << isa_name(isa) << " m=" << m;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace moeserve
