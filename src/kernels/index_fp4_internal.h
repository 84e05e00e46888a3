// What index_fp4.cpp's levels share (kernels/index_fp4.h).
#pragma once

#include <cstdint>
#include <cstring>

namespace moeserve::index_fp4_detail {

// Twice the e2m1 value of each code (sign in bit 3): integers in [-12, 12].
inline constexpr int8_t kE2m1Twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 127); e = 0 is 2^-127 (a subnormal F32).
inline float ue8m0_value(uint8_t e) {
  const uint32_t bits = e == 0 ? 0x00400000u : uint32_t(e) << 23;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

}  // namespace moeserve::index_fp4_detail
