// What index_fp4.cpp's levels share (kernels/index_fp4.h).
#pragma once

#include <cstdint>

namespace moeserve::index_fp4_detail {

// Values per key the AVX-512 level unpacks on its stack (longer keys score at the scalar level).
inline constexpr int64_t kMaxAvx512Dim = 1024;

// Twice the e2m1 value of each code (sign in bit 3): integers in [-12, 12].
inline constexpr int8_t kE2m1Twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

}  // namespace moeserve::index_fp4_detail
