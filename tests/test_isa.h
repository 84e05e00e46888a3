// Shared by the kernel tests of every subsystem: the ISA levels this CPU can run (each kernel
// is checked at all of them), bit equality of floats and their distance in ulps.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu_features.h"

namespace moeserve::testing {

inline std::vector<Isa> isa_levels() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx}) {
    if (isa_at_most(isa, cpu_isa())) out.push_back(isa);
  }
  return out;
}

// Same bits, or both NaN.
inline bool same_bits(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// Distance in units in the last place between floats of one sign (+0 and -0 are one value);
// INT64_MAX across signs.
inline int64_t ulps(float a, float b) {
  if (a == b) return 0;
  int32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  if ((x < 0) != (y < 0)) return INT64_MAX;
  return std::abs(int64_t(x) - int64_t(y));
}

}  // namespace moeserve::testing
