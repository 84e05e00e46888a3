// Shared by the kernel tests of every subsystem: the ISA levels this CPU can run (each kernel
// is checked at all of them) and bit equality of floats.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu_features.h"

namespace moeserve::testing {

inline std::vector<Isa> isa_levels() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
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

}  // namespace moeserve::testing
