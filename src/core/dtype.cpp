#include "core/dtype.h"

#include <array>
#include <limits>

namespace moeserve {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kF8E8M0:
      return "F8_E8M0";
    case DType::kF4E2M1:
      return "F4_E2M1";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view n) {
  if (n == "F32") return DType::kF32;
  if (n == "BF16") return DType::kBF16;
  if (n == "F16") return DType::kF16;
  if (n == "F8_E4M3") return DType::kF8E4M3;
  if (n == "I64") return DType::kI64;
  if (n == "I32") return DType::kI32;
  if (n == "U8") return DType::kU8;
  if (n == "I8") return DType::kI8;
  if (n == "F8_E8M0") return DType::kF8E8M0;
  return std::nullopt;
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
    case DType::kI64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kU8:
    case DType::kI8:
    case DType::kF8E8M0:
    case DType::kF4E2M1:
      return 1;
  }
  return 0;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

namespace {
std::array<float, 256> make_fp8_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) {
    int exp = (b >> 3) & 0xf, mant = b & 7;
    float v;
    if (exp == 0xf && mant == 7) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else if (exp == 0) {
      v = std::ldexp(float(mant), -9);
    } else {
      v = std::ldexp(1.0f + float(mant) / 8.0f, exp - 7);
    }
    t[b] = (b & 0x80) ? -v : v;
  }
  return t;
}
}  // namespace

const float* fp8e4m3_table() {
  static const std::array<float, 256> table = make_fp8_table();
  return table.data();
}

}  // namespace moeserve
