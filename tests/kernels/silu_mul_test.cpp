// silu_mul / silu_mul_bf16 (kernels/silu_mul.h) at every ISA level against the std::exp
// reference: within a few ulp on random and swept inputs, the reference's behaviour at the
// extremes (|g| up to 100, infinities, NaN), BF16 output = the F32 output rounded, the same bits
// at AVX2 and AVX-512, odd lengths and in-place use.
#include "kernels/silu_mul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../test_isa.h"
#include "core/dtype.h"

namespace moeserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// g: random normals of several scales, with the extremes mixed in; u: random normals.
void make_inputs(int64_t n, uint32_t seed, std::vector<float>& g, std::vector<float>& u) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float extremes[] = {
      100.0f,  -100.0f, 88.7f,  -88.7f, 88.73f, -88.73f,
      87.0f,   -87.0f,  -17.0f, -16.0f, 20.0f,  1e-30f,
      -1e-40f, 0.0f,    -0.0f,  kInf,   -kInf,  std::numeric_limits<float>::quiet_NaN(),
      50.0f,   -50.0f};
  g.resize(size_t(n));
  u.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    g[size_t(i)] = i % 5 == 2 ? extremes[size_t(i / 5) % std::size(extremes)]
                              : normal(rng) * (i % 3 == 0 ? 8.0f : 2.0f);
    u[size_t(i)] = normal(rng);
  }
}

// The fast result against the reference: the same non-finite class, else within `max_ulps`.
void expect_close(float got, float want, int64_t max_ulps, const std::string& what) {
  if (std::isnan(want)) {
    ASSERT_TRUE(std::isnan(got)) << what << ": " << got << " vs NaN";
  } else if (std::isinf(want)) {
    ASSERT_EQ(got, want) << what;
  } else {
    ASSERT_LE(testing::ulps(got, want), max_ulps) << what << ": " << got << " vs " << want;
  }
}

// Both the reference and the fast kernel are within 2 ulp of the exact value (an exp within ~1
// ulp, then a divide and a multiply; measured over the sweep below), so within 4 of each other.
constexpr int64_t kMaxUlps = 4;

TEST(SiluMul, MatchesTheReferenceAtEveryLevel) {
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 100, 1000, 4099}) {
    std::vector<float> g, u;
    make_inputs(n, uint32_t(n), g, u);
    std::vector<float> want(static_cast<size_t>(n));
    std::vector<uint16_t> want_b(static_cast<size_t>(n));
    silu_mul_ref(g.data(), u.data(), n, want.data());
    silu_mul_bf16_ref(g.data(), u.data(), n, want_b.data());
    std::vector<float> first_simd;
    for (Isa isa : testing::isa_levels()) {
      std::vector<float> out(size_t(n + 1), 7.0f);
      std::vector<uint16_t> out_b(size_t(n + 1), 0xabcd);
      silu_mul(g.data(), u.data(), n, out.data(), isa);
      silu_mul_bf16(g.data(), u.data(), n, out_b.data(), isa);
      EXPECT_EQ(out[size_t(n)], 7.0f) << "wrote past the end";
      EXPECT_EQ(out_b[size_t(n)], 0xabcd) << "wrote past the end";
      for (int64_t i = 0; i < n; ++i) {
        const std::string what = std::string(isa_name(isa)) + " n=" + std::to_string(n) +
                                 " i=" + std::to_string(i) + " g=" + std::to_string(g[size_t(i)]);
        expect_close(out[size_t(i)], want[size_t(i)], isa == Isa::kScalar ? 0 : kMaxUlps, what);
        // BF16: exactly the F32 result rounded, so within one BF16 ulp of the reference's.
        ASSERT_EQ(out_b[size_t(i)], f32_to_bf16(out[size_t(i)])) << what;
        expect_close(bf16_to_f32(out_b[size_t(i)]), bf16_to_f32(want_b[size_t(i)]),
                     isa == Isa::kScalar ? 0 : 1 << 16, what + " (bf16)");
      }
      if (isa == Isa::kScalar) continue;
      if (first_simd.empty()) {
        first_simd = out;
        continue;
      }
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(testing::same_bits(out[size_t(i)], first_simd[size_t(i)]))
            << isa_name(isa) << " differs from the first SIMD level at i=" << i;
      }
    }
  }
}

// Every g in [-104, 104] in steps of 1/1024 (u = 1 and u = -0.75): the fast exp over its whole
// range, including where exp(-g) overflows or 1 + exp(-g) rounds to 1; and against the value in
// double precision: within 3 ulp (2 measured), and nowhere more than 2 ulp worse than the
// reference.
TEST(SiluMul, SweepStaysWithinAFewUlps) {
  std::vector<float> g;
  for (int64_t k = -104 * 1024; k <= 104 * 1024; ++k) g.push_back(float(k) / 1024.0f);
  const int64_t n = int64_t(g.size());
  for (float uval : {1.0f, -0.75f}) {
    std::vector<float> u(size_t(n), uval), want(static_cast<size_t>(n));
    silu_mul_ref(g.data(), u.data(), n, want.data());
    for (Isa isa : testing::isa_levels()) {
      if (isa == Isa::kScalar) continue;
      std::vector<float> out(static_cast<size_t>(n));
      silu_mul(g.data(), u.data(), n, out.data(), isa);
      int64_t worst = 0, worst_exact = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float gi = g[size_t(i)];
        expect_close(out[size_t(i)], want[size_t(i)], kMaxUlps,
                     std::string(isa_name(isa)) + " g=" + std::to_string(gi));
        const double exact = double(gi) / (1.0 + std::exp(-double(gi))) * double(uval);
        if (std::fabs(exact) < 1e-37) continue;  // subnormal results: absolute error only
        const float exact_f = float(exact);
        if (want[size_t(i)] == 0.0f) continue;  // exp(-g) overflowed in F32 for both
        worst = std::max(worst, testing::ulps(out[size_t(i)], exact_f) -
                                    testing::ulps(want[size_t(i)], exact_f));
        worst_exact = std::max(worst_exact, testing::ulps(out[size_t(i)], exact_f));
      }
      EXPECT_LE(worst_exact, 3) << isa_name(isa) << ": ulps from the exact value";
      EXPECT_LE(worst, 2) << isa_name(isa) << ": ulps beyond the reference's own error";
    }
  }
}

float nan_with_payload(uint32_t bits) {  // a NaN whose rounding to BF16 would carry into -0
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(SiluMul, ExtremesBehaveAsTheReference) {
  const float gs[] = {100.0f, -100.0f, 1e30f, -1e30f, kInf, -kInf, 89.0f, -89.0f};
  for (Isa isa : testing::isa_levels()) {
    for (float gv : gs) {
      for (float uv : {2.0f, -3.0f}) {
        float out;
        silu_mul(&gv, &uv, 1, &out, isa);
        if (gv == -kInf) {
          EXPECT_TRUE(std::isnan(out)) << isa_name(isa);  // -inf / inf, as the reference
        } else if (gv < 0) {
          EXPECT_EQ(out, 0.0f) << isa_name(isa) << " g=" << gv;  // silu -> 0
        } else {
          EXPECT_EQ(out, gv * uv) << isa_name(isa) << " g=" << gv;  // silu(g) = g exactly
        }
      }
    }
    const float nan = std::numeric_limits<float>::quiet_NaN(), one = 1.0f;
    float out;
    silu_mul(&nan, &one, 1, &out, isa);
    EXPECT_TRUE(std::isnan(out)) << isa_name(isa);
    silu_mul(&one, &nan, 1, &out, isa);
    EXPECT_TRUE(std::isnan(out)) << isa_name(isa);
    for (float g : {nan, nan_with_payload(0x7fffffffu), nan_with_payload(0xffffffffu)}) {
      uint16_t b;
      silu_mul_bf16(&g, &one, 1, &b, isa);
      EXPECT_TRUE(std::isnan(bf16_to_f32(b))) << isa_name(isa);
    }
  }
}

TEST(SiluMul, OutputMayBeEitherInput) {
  const int64_t n = 45;
  std::vector<float> g, u;
  make_inputs(n, 3, g, u);
  for (Isa isa : testing::isa_levels()) {
    std::vector<float> want(static_cast<size_t>(n));
    silu_mul(g.data(), u.data(), n, want.data(), isa);
    std::vector<float> gg = g, uu = u;
    silu_mul(gg.data(), u.data(), n, gg.data(), isa);
    silu_mul(g.data(), uu.data(), n, uu.data(), isa);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(testing::same_bits(gg[size_t(i)], want[size_t(i)])) << isa_name(isa);
      ASSERT_TRUE(testing::same_bits(uu[size_t(i)], want[size_t(i)])) << isa_name(isa);
    }
  }
}

}  // namespace
}  // namespace moeserve
