// The latent KV token formats (kernels/kv_token.h), FlashMLA's FP8 with scale above all: sizes
// and offsets, the scale rule (FlashMLA's tests/quant.py), hand-worked bytes, and the
// quantize / dequantize round trip's error bound on tiles of every magnitude.
#include "kernels/kv_token.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace moeserve {
namespace {

TEST(KvToken, BytesAndOffsetsOfDeepSeekV3) {
  const KvTokenFormat fp8{DType::kF8E4M3, 512, 64};
  EXPECT_EQ(fp8.bytes(), 656);  // FlashMLA's README: 512 + 4 x 4 + 64 x 2
  EXPECT_EQ(fp8.fp8_scales_offset(), 512);
  EXPECT_EQ(fp8.fp8_rope_offset(), 528);
  EXPECT_EQ((KvTokenFormat{DType::kBF16, 512, 64}.bytes()), 1152);
  EXPECT_EQ((KvTokenFormat{DType::kF32, 512, 64}.bytes()), 2304);
  EXPECT_EQ((KvTokenFormat{DType::kF8E4M3, 128, 16}.bytes()), 128 + 4 + 32);
}

TEST(KvToken, Fp8NeedsWholeScaleTiles) {
  const Status st = kv_token_format_status({DType::kF8E4M3, 160, 32});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("multiple of 128"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("160"), std::string::npos) << st.message();
  EXPECT_TRUE(kv_token_format_status({DType::kBF16, 160, 32}).ok());
  EXPECT_TRUE(kv_token_format_status({DType::kF8E4M3, 256, 13}).ok());
  EXPECT_FALSE(kv_token_format_status({DType::kF16, 512, 64}).ok());
}

// s = 2^ceil(log2(max(amax / 448, 1e-4))), as FlashMLA's quantize_k_cache.
TEST(KvToken, Fp8ScaleIsThePowerOfTwoAtOrAboveAmaxOver448) {
  EXPECT_EQ(kv_fp8_tile_scale(448.0f), 1.0f);
  EXPECT_EQ(kv_fp8_tile_scale(448.5f), 2.0f);
  EXPECT_EQ(kv_fp8_tile_scale(224.0f), 0.5f);
  EXPECT_EQ(kv_fp8_tile_scale(224.5f), 1.0f);
  EXPECT_EQ(kv_fp8_tile_scale(1.0f), 0x1p-8f);  // 1 / 448 = 2^-8.8
  EXPECT_EQ(kv_fp8_tile_scale(3.0f), 0x1p-7f);
  // The floor: 1e-4 lies in (2^-14, 2^-13].
  EXPECT_EQ(kv_fp8_tile_scale(0.0f), 0x1p-13f);
  EXPECT_EQ(kv_fp8_tile_scale(1e-9f), 0x1p-13f);
  EXPECT_EQ(kv_fp8_tile_scale(0x1p-13f * 448.0f), 0x1p-13f);
  EXPECT_EQ(kv_fp8_tile_scale(0x1p-13f * 449.0f), 0x1p-12f);
}

// One token worked by hand: tile 0 holds 1, -0.5 and 3 (amax 3: s = 2^-7, so 128, -64, 384),
// tile 1 is all zero (s = 2^-13, codes 0); the rope key is BF16.
TEST(KvToken, Fp8BytesWorkedByHand) {
  const KvTokenFormat f{DType::kF8E4M3, 256, 2};
  std::vector<float> v(258, 0.0f);
  v[0] = 1.0f;
  v[1] = -0.5f;
  v[2] = 3.0f;
  v[256] = 1.5f;
  v[257] = -2.0f;
  std::vector<uint8_t> tok(size_t(f.bytes()), 0xaa);
  kv_token_store(f, v.data(), tok.data());
  EXPECT_EQ(tok[0], 0x70);  // 128 = 2^7: exponent 7 + 7, mantissa 0
  EXPECT_EQ(tok[1], 0xe8);  // -64 = -2^6
  EXPECT_EQ(tok[2], 0x7c);  // 384 = 1.5 x 2^8
  for (int i = 3; i < 256; ++i) ASSERT_EQ(tok[size_t(i)], 0x00) << i;
  uint32_t s0, s1;
  std::memcpy(&s0, &tok[256], 4);
  std::memcpy(&s1, &tok[260], 4);
  EXPECT_EQ(s0, 0x3c000000u);                   // 2^-7
  EXPECT_EQ(s1, 0x39000000u);                   // 2^-13
  EXPECT_EQ(tok[264] | tok[265] << 8, 0x3fc0);  // 1.5 in BF16
  EXPECT_EQ(tok[266] | tok[267] << 8, 0xc000);  // -2
  std::vector<float> back(258);
  kv_token_load(f, tok.data(), back.data());
  EXPECT_EQ(back, v);  // every value here is exact in the format
}

// A random token whose 128-value tiles span many magnitudes (amax from 1e-9 to 1e4), some
// with one outlier. Per value: |x - x'| <= 2^-4 max(amax, 2^-19) (half an e4m3 step of the
// tile), and <= 2^-4 |x| where x / s is a normal e4m3; per tile: s is a power of two with
// amax <= 448 s, and > 224 s unless the 1e-4 floor holds s at 2^-13; the rope key round-trips
// as BF16 exactly. Dequantized values are BF16-exact (kernels dequantize to BF16).
TEST(KvToken, Fp8RoundTripErrorWithinHalfAStepOfTheTile) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-9.0f, 4.0f);  // log10 of the tile's magnitude
  for (const KvTokenFormat f :
       {KvTokenFormat{DType::kF8E4M3, 512, 64}, KvTokenFormat{DType::kF8E4M3, 256, 13}}) {
    const int64_t R = f.kv_lora_rank, D = f.dim();
    std::vector<uint8_t> tok(static_cast<size_t>(f.bytes()));
    std::vector<float> v(static_cast<size_t>(D)), back(static_cast<size_t>(D));
    for (int trial = 0; trial < 200; ++trial) {
      for (int64_t t0 = 0; t0 < R; t0 += kKvFp8Tile) {
        const float m = std::pow(10.0f, mag(rng));
        for (int64_t i = t0; i < t0 + kKvFp8Tile; ++i) v[size_t(i)] = u(rng) * m;
        if (trial % 3 == 0) v[size_t(t0 + trial % kKvFp8Tile)] = 40.0f * m;  // an outlier
        if (trial % 7 == 0) v[size_t(t0 + 5)] = 0.0f;
      }
      for (int64_t i = R; i < D; ++i) v[size_t(i)] = u(rng) * 3.0f;
      kv_token_store(f, v.data(), tok.data());
      kv_token_load(f, tok.data(), back.data());
      for (int64_t t0 = 0; t0 < R; t0 += kKvFp8Tile) {
        float amax = 0.0f, s = 0.0f;
        for (int64_t i = t0; i < t0 + kKvFp8Tile; ++i) amax = std::max(amax, std::fabs(v[i]));
        std::memcpy(&s, &tok[size_t(R + t0 / kKvFp8Tile * 4)], 4);
        int e = 0;
        ASSERT_EQ(std::frexp(s, &e), 0.5f) << "scale " << s << " is not a power of two";
        ASSERT_LE(amax, 448.0f * s);
        if (s > 0x1p-13f) {
          ASSERT_GT(amax, 224.0f * s) << "scale " << s << " amax " << amax;
        }
        const float bound = 0x1p-4f * std::max(amax, 0x1p-19f);
        for (int64_t i = t0; i < t0 + kKvFp8Tile; ++i) {
          const float x = v[size_t(i)], err = std::fabs(x - back[size_t(i)]);
          ASSERT_LE(err, bound) << "tile " << t0 / 128 << " value " << i << ": " << x;
          if (std::fabs(x) / s >= 0x1p-6f) {
            ASSERT_LE(err, 0x1p-4f * std::fabs(x)) << x;
          }
          ASSERT_EQ(bf16_to_f32(f32_to_bf16(back[size_t(i)])), back[size_t(i)]);
        }
      }
      for (int64_t i = R; i < D; ++i) {
        ASSERT_EQ(back[size_t(i)], bf16_to_f32(f32_to_bf16(v[size_t(i)]))) << "rope " << i;
      }
    }
  }
}

// DeepSeek-V4's FP8 layout (KvFp8Layout::kV4): 448 e4m3 bytes, 7 UE8M0 scale bytes, 64 BF16 rope
// values, 583 bytes; each 64-value tile as model.py's act_quant(x, 64, "ue8m0") rounds it, stated
// directly: s = 2^ceil(log2(max(amax, 1e-4) / 448)), each x / s the nearest e4m3 value (the
// nearest of all 253 finite ones, a tie to the even code), the byte log2(s) + 127.
TEST(KvToken, V4Fp8IsModelPysActQuantPer64) {
  const KvTokenFormat f{DType::kF8E4M3, 448, 64, KvFp8Layout::kV4};
  ASSERT_TRUE(kv_token_format_status(f).ok());
  EXPECT_EQ(f.bytes(), 583);
  EXPECT_EQ(f.fp8_rope_offset(), 455);
  EXPECT_FALSE(kv_token_format_status({DType::kF8E4M3, 96, 32, KvFp8Layout::kV4}).ok());
  auto nearest = [&](double y) {
    double best = 0, bd = 1e300;
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;
      const double g = double(fp8e4m3_to_f32(uint8_t(c))), d = std::fabs(y - g);
      if (d < bd || (d == bd && (c & 1) == 0)) bd = d, best = g;
    }
    return best;
  };
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-9.0f, 4.0f);
  std::vector<uint8_t> tok(583);
  std::vector<float> v(512), back(512);
  for (int trial = 0; trial < 60; ++trial) {
    for (int64_t t0 = 0; t0 < 448; t0 += 64) {
      const float m = std::pow(10.0f, mag(rng));
      for (int64_t i = t0; i < t0 + 64; ++i) v[size_t(i)] = u(rng) * m;
      if (trial % 5 == 0) std::fill(v.begin() + t0, v.begin() + t0 + 64, 0.0f);
    }
    for (int64_t i = 448; i < 512; ++i) v[size_t(i)] = u(rng);
    kv_token_store(f, v.data(), tok.data());
    kv_token_load(f, tok.data(), back.data());
    for (int64_t t0 = 0; t0 < 448; t0 += 64) {
      double amax = 1e-4;
      for (int64_t i = t0; i < t0 + 64; ++i) amax = std::max(amax, double(std::fabs(v[i])));
      const int e = int(std::ceil(std::log2(double(float(amax) * (1.0f / 448.0f)))));
      ASSERT_EQ(int(tok[size_t(448 + t0 / 64)]), e + 127) << "tile " << t0 / 64;
      const double s = std::ldexp(1.0, e);
      for (int64_t i = t0; i < t0 + 64; ++i) {
        const double want = nearest(std::clamp(double(v[i]) / s, -448.0, 448.0)) * s;
        ASSERT_EQ(double(back[size_t(i)]), want) << "value " << i << ": " << v[i];
      }
    }
    for (int64_t i = 448; i < 512; ++i) {
      ASSERT_EQ(back[size_t(i)], bf16_to_f32(f32_to_bf16(v[size_t(i)])));
    }
  }
}

// BF16 and F32 tokens: what the cache stored before FP8 existed (round to nearest even; copy).
TEST(KvToken, Bf16AndF32TokensAreRoundedAndCopied) {
  const std::vector<float> v = {1.0f + 0x1p-9f, -3.14159f, 1e-30f, 65504.0f};
  std::vector<float> back(4);
  std::vector<uint8_t> tok(16);
  kv_token_store({DType::kBF16, 3, 1}, v.data(), tok.data());
  kv_token_load({DType::kBF16, 3, 1}, tok.data(), back.data());
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(back[i], bf16_to_f32(f32_to_bf16(v[i]))) << i;
  kv_token_store({DType::kF32, 3, 1}, v.data(), tok.data());
  kv_token_load({DType::kF32, 3, 1}, tok.data(), back.data());
  EXPECT_EQ(back, v);
}

}  // namespace
}  // namespace moeserve
