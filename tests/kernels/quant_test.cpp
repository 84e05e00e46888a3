// 1x128 FP8 activation quantization: known values, every level bit-identical to the
// reference on random rows of awkward widths, and the dequantization error bound.
#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../test_isa.h"
#include "core/dtype.h"

namespace moeserve {
namespace {

TEST(QuantFp8, KnownValues) {
  // One group, amax 2: x * 224 -> 1 -> 224 (0x76), -2 -> -448 (0xfe), 0.5 -> 112 (0x6e).
  std::vector<uint16_t> x = {f32_to_bf16(1.0f), f32_to_bf16(-2.0f), f32_to_bf16(0.5f)};
  for (Isa isa : {Isa::kScalar, cpu_isa()}) {
    std::vector<uint8_t> q(3);
    float scale = 0;
    quantize_fp8_1x128(x.data(), 1, 3, 3, q.data(), 3, &scale, isa);
    EXPECT_EQ(q[0], 0x76);
    EXPECT_EQ(q[1], 0xfe);
    EXPECT_EQ(q[2], 0x6e);
    EXPECT_EQ(scale, 2.0f / 448.0f);
  }
}

TEST(QuantFp8, AllZeroGroupUsesTheAmaxFloor) {
  std::vector<uint16_t> x(130, 0);
  x[129] = f32_to_bf16(3.0f);
  std::vector<uint8_t> q(130);
  float s[2];
  quantize_fp8_1x128(x.data(), 1, 130, 130, q.data(), 130, s);
  EXPECT_EQ(s[0], 1e-4f / 448.0f);
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(s[1], 3.0f / 448.0f);
  EXPECT_EQ(q[129], 0x7e);
}

TEST(QuantFp8, EveryLevelMatchesReferenceBitForBit) {
  std::mt19937 rng(7);
  std::lognormal_distribution<float> mag(0.f, 3.f);  // wide dynamic range: subnormal fp8 too
  std::bernoulli_distribution neg(0.5);
  for (int64_t cols : {1, 7, 128, 129, 300, 1000, 7168}) {
    const int64_t rows = 5, ldx = cols + 9, ldq = cols + 3, groups = (cols + 127) / 128;
    std::vector<uint16_t> x(size_t(rows * ldx));
    for (auto& v : x) v = f32_to_bf16(neg(rng) ? -mag(rng) : mag(rng));
    std::vector<uint8_t> want(size_t(rows * ldq), 0), got(size_t(rows * ldq), 0);
    std::vector<float> ws(size_t(rows * groups)), gs(size_t(rows * groups));
    quantize_fp8_1x128_ref(x.data(), rows, cols, ldx, want.data(), ldq, ws.data());
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx}) {
      if (!isa_at_most(isa, cpu_isa())) continue;
      std::fill(got.begin(), got.end(), 0);
      quantize_fp8_1x128(x.data(), rows, cols, ldx, got.data(), ldq, gs.data(), isa);
      ASSERT_EQ(got, want) << isa_name(isa) << " cols " << cols;
      ASSERT_EQ(gs, ws) << isa_name(isa) << " cols " << cols;
    }
    // Dequantized values are within FP8's half step of x (relative 2^-4 for normals, 2^-10 *
    // scale for subnormals), plus BF16 rounding.
    std::vector<uint16_t> y(size_t(rows * cols));
    dequantize_fp8_1x128(want.data(), ldq, ws.data(), rows, cols, y.data(), cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        double xv = bf16_to_f32(x[size_t(r * ldx + c)]), yv = bf16_to_f32(y[size_t(r * cols + c)]);
        double s = ws[size_t(r * groups + c / 128)];
        ASSERT_LE(std::fabs(xv - yv), std::fabs(xv) * (1.0 / 16 + 1.0 / 256) + s / 1024 * 1.01)
            << "row " << r << " col " << c;
      }
    }
  }
}

// F32 rows: the bits of rounding them to BF16 and quantizing, at every level; values at BF16
// rounding ties, specials (NaN, inf, signed zero, FP32 subnormals) included.
TEST(QuantFp8, F32RowsQuantizeLikeTheirBf16Rounding) {
  std::mt19937 rng(8);
  std::lognormal_distribution<float> mag(0.f, 3.f);
  std::uniform_int_distribution<uint32_t> low(0, 0xffff);
  for (int64_t cols : {1, 15, 128, 129, 300, 2048}) {
    const int64_t rows = 4, ldx = cols + 5, ldq = cols + 2, groups = (cols + 127) / 128;
    std::vector<float> x(size_t(rows * ldx));
    for (size_t i = 0; i < x.size(); ++i) {
      float v = mag(rng) * (i % 2 ? -1.0f : 1.0f);
      uint32_t u;
      std::memcpy(&u, &v, 4);
      u = (u & 0xffff0000u) | (i % 5 == 0 ? 0x8000u : low(rng));  // every fifth a tie
      std::memcpy(&v, &u, 4);
      x[i] = v;
    }
    x[3 % x.size()] = -0.0f;
    if (x.size() > 40) {
      x[17] = std::numeric_limits<float>::quiet_NaN();
      x[23] = 1e-40f;  // FP32 subnormal
      x[31] = -std::numeric_limits<float>::infinity();
    }
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
    std::vector<uint8_t> want(size_t(rows * ldq), 0), got(size_t(rows * ldq), 0);
    std::vector<float> ws(size_t(rows * groups)), gs(size_t(rows * groups));
    quantize_fp8_1x128_ref(xb.data(), rows, cols, ldx, want.data(), ldq, ws.data());
    for (Isa isa : testing::isa_levels()) {
      std::fill(got.begin(), got.end(), 0);
      quantize_fp8_1x128_f32(x.data(), rows, cols, ldx, got.data(), ldq, gs.data(), isa);
      EXPECT_EQ(got, want) << isa_name(isa) << " cols " << cols;
      EXPECT_EQ(std::memcmp(gs.data(), ws.data(), ws.size() * 4), 0)
          << isa_name(isa) << " cols " << cols;
    }
  }
}

}  // namespace
}  // namespace moeserve
