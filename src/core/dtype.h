// Element types that appear in checkpoints and buffers, and scalar conversions between them.
//
// bf16 and fp8 e4m3 (the "fn" variant: no infinities, one NaN pattern per sign, max 448) are
// stored as raw bits. Conversions to float are exact; conversions from float round to nearest
// even. fp8 encoding saturates to +-448 (DeepGEMM/DeepEP scale so that |x| <= 448 anyway).
// These are the scalar references; SIMD code in kernels/ must agree with them bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace moeserve {

// kF8E8M0: one byte per value, 2^(byte - 127) (the UE8M0 scales of DeepSeek-V4's checkpoints);
// kF4E2M1: FP4 e2m1, two values per byte (element 2j in the low nibble), only as a WeightView's
// format (safetensors stores it as I8: docs/deepseek-v4.md).
enum class DType { kF32, kBF16, kF16, kF8E4M3, kI64, kI32, kU8, kI8, kF8E8M0, kF4E2M1 };

// Name as safetensors writes it ("F32", "BF16", "F16", "F8_E4M3", "I64", "I32", "U8", "I8",
// "F8_E8M0"; kF4E2M1 has none).
const char* dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);
size_t dtype_size(DType t);  // bytes per value (kF4E2M1: 1, per pair of values)

struct bf16 {
  uint16_t bits = 0;
};
struct fp8e4m3 {
  uint8_t bits = 0;
};

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t b) {
  return f32_from_bits(uint32_t(b) << 16);
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);

// All 256 fp8 e4m3 values as float (NaN for 0x7f/0xff).
const float* fp8e4m3_table();
inline float fp8e4m3_to_f32(uint8_t b) {
  return fp8e4m3_table()[b];
}

// FP4 e2m1 (a nibble: sign, 2 exponent bits, 1 mantissa bit; no inf or NaN).
inline float fp4e2m1_to_f32(uint8_t nibble) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[nibble & 0xf];
}
// A UE8M0 scale byte: 2^(byte - 127) (0xff is NaN in the format; read as 2^128 = inf here),
// built from its bits (hot in the FP4 index kernels): byte 0 is the subnormal 2^-127.
inline float f8e8m0_to_f32(uint8_t b) {
  return f32_from_bits(b == 0 ? 0x00400000u : uint32_t(b) << 23);
}

inline uint8_t f32_to_fp8e4m3(float f) {
  uint32_t u = f32_bits(f);
  uint8_t sign = uint8_t((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;  // NaN
  float af = f32_from_bits(a);
  if (af >= 448.0f) return sign | 0x7e;  // saturate
  if (af < 0.015625f) {                  // below 2^-6: subnormal step 2^-9
    // nearbyint rounds half to even in the default rounding mode; q == 8 encodes 2^-6 exactly.
    return sign | uint8_t(std::nearbyint(af * 512.0f));
  }
  a += 0x7ffffu + ((a >> 20) & 1u);  // round 23-bit mantissa to 3 bits, ties to even
  uint32_t code = (a >> 20) - (120u << 3);
  if (code > 0x7e) code = 0x7e;
  return sign | uint8_t(code);
}

constexpr float kFp8E4M3Max = 448.0f;

}  // namespace moeserve
