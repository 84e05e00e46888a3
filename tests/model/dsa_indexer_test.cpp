// The lightning indexer's arithmetic (model/dsa_indexer.h) against direct definitions.
#include "model/dsa_indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/dtype.h"

namespace moeserve {
namespace {

// Sylvester's construction, entry by entry: H[i][j] = (-1)^popcount(i & j).
TEST(DsaIndexer, HadamardIsTheNormalisedSylvesterMatrix) {
  constexpr int64_t n = 128;
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  std::vector<float> x(n), y(n);
  for (float& v : x) v = g(rng);
  y = x;
  hadamard_rotate(y.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    double want = 0;
    for (int64_t j = 0; j < n; ++j) {
      want += (__builtin_popcountll(uint64_t(i & j)) % 2 ? -1.0 : 1.0) * double(x[size_t(j)]);
    }
    EXPECT_NEAR(y[size_t(i)], want / std::sqrt(double(n)), 1e-5) << i;
  }
  hadamard_rotate(y.data(), n);  // orthonormal and symmetric: its own inverse
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[size_t(i)], x[size_t(i)], 1e-5);
}

// DeepSeek's act_quant with ue8m0 scales: a power of two s with amax / s in (224, 448], values
// e4m3(x / s).
TEST(DsaIndexer, Fp8KeysHaveAPowerOfTwoScale) {
  std::mt19937 rng(5);
  for (float amp : {1e-6f, 0.01f, 1.0f, 3.7f, 448.0f, 1e4f}) {
    std::uniform_real_distribution<float> u(-amp, amp);
    std::vector<float> x(kIndexKeyDim);
    for (float& v : x) v = u(rng);
    std::vector<uint8_t> q(kIndexKeyDim);
    const float s = quantize_index_fp8(x.data(), q.data());
    int e = 0;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << "a power of two: " << s;
    float amax = 1e-4f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    EXPECT_GT(amax / s, 224.0f) << amp;
    EXPECT_LE(amax / s, 448.0f) << amp;
    for (int64_t i = 0; i < kIndexKeyDim; ++i) {
      ASSERT_EQ(q[size_t(i)], f32_to_fp8e4m3(x[size_t(i)] / s)) << i;
    }
  }
}

TEST(DsaIndexer, ScoresAreTheWeightedSumOfReluDotProducts) {
  constexpr int64_t heads = 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> g;
  std::vector<float> q(heads * kIndexKeyDim), k(kIndexKeyDim), w = {0.5f, -0.25f, 2.0f};
  for (float& v : q) v = g(rng);
  for (float& v : k) v = g(rng);
  std::vector<uint8_t> q8(q.size()), k8(k.size());
  std::vector<float> qs(heads);
  for (int64_t h = 0; h < heads; ++h)
    qs[size_t(h)] = quantize_index_fp8(&q[size_t(h * 128)], &q8[size_t(h * 128)]);
  const float ks = quantize_index_fp8(k.data(), k8.data());
  double want = 0, want_f32 = 0;
  for (int64_t h = 0; h < heads; ++h) {
    double dot = 0, dot_f32 = 0;
    for (int64_t d = 0; d < kIndexKeyDim; ++d) {
      dot += double(fp8e4m3_to_f32(q8[size_t(h * 128 + d)])) * fp8e4m3_to_f32(k8[size_t(d)]);
      dot_f32 += double(q[size_t(h * 128 + d)]) * k[size_t(d)];
    }
    want += w[size_t(h)] * std::max(dot, 0.0);
    want_f32 += w[size_t(h)] * std::max(dot_f32 * 0.125, 0.0);
  }
  EXPECT_NEAR(index_score(q8.data(), w.data(), heads, k8.data(), ks), ks * want,
              1e-4 * std::fabs(ks * want) + 1e-6);
  EXPECT_NEAR(index_score_f32(q.data(), w.data(), heads, k.data(), 0.125f), want_f32,
              1e-4 * std::fabs(want_f32) + 1e-6);
}

// The k best by score, ties to the lower position, returned ascending; all when k >= n.
TEST(DsaIndexer, TopKIsTheBestKByScoreThenPosition) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> u(0, 20);  // many ties
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t n = 1 + trial * 7, k = 1 + trial % 17;
    std::vector<float> s(static_cast<size_t>(n));
    for (float& v : s) v = float(u(rng));
    std::vector<int32_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[size_t(i)] = int32_t(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)]; });
    order.resize(size_t(std::min(n, k)));
    std::sort(order.begin(), order.end());
    EXPECT_EQ(top_k_positions(s, k), order) << n << " " << k;
  }
}

TEST(DsaIndexer, RopeHalfRotatesPairsHalfADimApart) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8}, inv = {1.0f, 0.5f, 0.25f, 0.125f};
  std::vector<float> y = x;
  rope_half(y.data(), 8, inv, 1.0f, 3);
  for (int i = 0; i < 4; ++i) {
    const float a = 3.0f * inv[size_t(i)];
    EXPECT_FLOAT_EQ(y[size_t(i)], x[size_t(i)] * std::cos(a) - x[size_t(i + 4)] * std::sin(a));
    EXPECT_FLOAT_EQ(y[size_t(i + 4)], x[size_t(i)] * std::sin(a) + x[size_t(i + 4)] * std::cos(a));
  }
}

}  // namespace
}  // namespace moeserve
