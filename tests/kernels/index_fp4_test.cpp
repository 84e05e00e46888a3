// DeepSeek-V4's FP4 lightning-indexer keys (kernels/index_fp4.h): the rounding against a plain
// statement of model.py's fp4_act_quant (the power-of-two scale from log2, the nearest of the
// e2m1 grid with ties to the even code), and the scores at every ISA level this CPU runs against
// the same sum taken in double over the dequantized values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "../test_isa.h"
#include "kernels/index_fp4.h"

namespace moeserve {
namespace {

constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// model.py's fp4_act_quant, stated directly: scale = 2^ceil(log2(amax / 6)) with amax at least
// 6 * 2^-126; x / scale clamped to 6 and rounded to the nearest grid value, a tie going to the
// even code (codes 0, 2, 4, 6: 0, 1, 2, 4).
std::vector<float> fp4_round(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t b = 0; b < x.size(); b += 32) {
    double amax = 6.0 * std::ldexp(1.0, -126);
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, double(std::fabs(x[i])));
    const double scale =
        std::ldexp(1.0, int(std::ceil(std::log2(double(float(amax) * (1.0f / 6.0f))))));
    for (size_t i = b; i < b + 32; ++i) {
      const double a = std::min(6.0, std::fabs(double(x[i])) / scale);
      int best = 0;
      for (int c = 1; c < 8; ++c) {
        const double dc = std::fabs(a - kGrid[c]), db = std::fabs(a - kGrid[best]);
        if (dc < db || (dc == db && c % 2 == 0)) best = c;
      }
      out[i] = float((x[i] < 0 ? -1.0 : 1.0) * kGrid[best] * scale);
    }
  }
  return out;
}

TEST(IndexFp4, RoundsAsModelPyDoes) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(128);
    const float mag = std::ldexp(1.0f, int(rng() % 40) - 20);
    for (float& v : x) v = nd(rng) * mag;
    if (trial % 7 == 0) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block
    // Exact ties: a block whose largest is 6 (scale 1) holding every midpoint of the grid.
    if (trial == 1) {
      const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f, -0.75f, -5.0f};
      std::fill(x.begin(), x.begin() + 32, 0.1f);
      x[0] = 6.0f;
      std::copy(std::begin(ties), std::end(ties), x.begin() + 1);
    }
    std::vector<uint8_t> packed(size_t(fp4_index_key_bytes(128)));
    ASSERT_EQ(packed.size(), 68u);
    fp4_index_quantize(x.data(), 128, packed.data());
    std::vector<float> got(128);
    fp4_index_dequantize(packed.data(), 128, got.data());
    const std::vector<float> want = fp4_round(x);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "trial " << trial << " value " << i << " x " << x[i];
    }
    if (trial == 1) {  // the ties went to the even codes
      const float expect[] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, 0.0f, -1.0f, -4.0f};
      for (int i = 0; i < 10; ++i) EXPECT_EQ(got[size_t(1 + i)], expect[i]) << i;
    }
  }
}

TEST(IndexFp4, ScoresMatchTheDequantizedSumAtEveryLevel) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Case {
    int64_t heads, d, n;
  };
  const Case cases[] = {
      {64, 128, 37}, {16, 128, 1},  {48, 64, 20}, {80, 128, 9}, {8, 128, 5},
      {64, 32, 16},  {128, 256, 3}, {16, 2048, 3}};  // past what the AVX-512 level unpacks: scalar
  int64_t checked = 0;
  for (const Case& c : cases) {
    std::vector<float> q(size_t(c.heads * c.d)), w(size_t(c.heads));
    for (float& v : q) v = nd(rng) * 0.3f;
    for (float& v : w) v = nd(rng);
    const int64_t kb = fp4_index_key_bytes(c.d), ld = kb + 5;  // keys not packed tight
    std::vector<uint8_t> keys(size_t(c.n * ld), 0xcd);
    std::vector<float> kx(size_t(c.d));
    for (int64_t j = 0; j < c.n; ++j) {
      const float mag = std::ldexp(1.0f, int(rng() % 12) - 6);
      for (float& v : kx) v = nd(rng) * mag;
      fp4_index_quantize(kx.data(), c.d, &keys[size_t(j * ld)]);
    }
    Fp4IndexQuery prepared;
    fp4_index_query(q.data(), w.data(), c.heads, c.d, prepared);
    // The oracle: model.py's einsum over the rounded values, in double.
    std::vector<float> qr(q.size());
    for (int64_t h = 0; h < c.heads; ++h) {
      const std::vector<float> r =
          fp4_round(std::vector<float>(q.begin() + h * c.d, q.begin() + (h + 1) * c.d));
      std::copy(r.begin(), r.end(), qr.begin() + h * c.d);
    }
    for (Isa isa : testing::isa_levels()) {
      std::vector<float> got(size_t(c.n + 2), -7.0f);
      fp4_index_scores(prepared, keys.data(), c.n, ld, got.data(), isa);
      ASSERT_EQ(got[size_t(c.n)], -7.0f);
      for (int64_t j = 0; j < c.n; ++j) {
        std::vector<float> k(size_t(c.d));
        fp4_index_dequantize(&keys[size_t(j * ld)], c.d, k.data());
        double want = 0, mag = 0;
        for (int64_t h = 0; h < c.heads; ++h) {
          double dot = 0, adot = 0;
          for (int64_t i = 0; i < c.d; ++i) {
            dot += double(qr[size_t(h * c.d + i)]) * k[size_t(i)];
            adot += std::fabs(double(qr[size_t(h * c.d + i)]) * k[size_t(i)]);
          }
          want += double(w[size_t(h)]) * std::max(dot, 0.0);
          mag += std::fabs(double(w[size_t(h)])) * adot;
        }
        ASSERT_LE(std::fabs(double(got[size_t(j)]) - want), 1e-6 * mag + 1e-30)
            << isa_name(isa) << " heads " << c.heads << " d " << c.d << " key " << j;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace moeserve
