#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace moeserve {
namespace {

TEST(Fp8E4M3, TableHasKnownValues) {
  EXPECT_EQ(fp8e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
}

TEST(Fp8E4M3, EncodeRoundTripsEveryFiniteValue) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    float v = fp8e4m3_to_f32(uint8_t(b));
    uint8_t e = f32_to_fp8e4m3(v);
    if (v == 0.0f) {
      EXPECT_EQ(fp8e4m3_to_f32(e), 0.0f);
    } else {
      EXPECT_EQ(e, b) << "value " << v;
    }
  }
}

// Against a brute-force nearest search with ties to the even code.
TEST(Fp8E4M3, EncodeIsNearestEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-12.0f, 9.0f);
  for (int i = 0; i < 20000; ++i) {
    float x = std::exp2(mag(rng)) * ((i & 1) ? -1.0f : 1.0f);
    if (std::fabs(x) >= 448.0f) continue;
    int best = -1;
    float best_err = INFINITY;
    for (int b = 0; b < 256; ++b) {
      if ((b & 0x7f) == 0x7f) continue;
      float v = fp8e4m3_to_f32(uint8_t(b));
      if ((v < 0) != (x < 0) && v != 0.0f) continue;
      float err = std::fabs(v - x);
      if (err < best_err || (err == best_err && (b & 1) == 0)) {
        best = b;
        best_err = err;
      }
    }
    EXPECT_EQ(fp8e4m3_to_f32(f32_to_fp8e4m3(x)), fp8e4m3_to_f32(uint8_t(best))) << "x=" << x;
  }
  EXPECT_EQ(f32_to_fp8e4m3(1000.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-1000.0f), 0xfe);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(3.140625f)), 3.140625f);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
}

TEST(F16, Decodes) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
}

}  // namespace
}  // namespace moeserve
