// Random FP8 weight problems shared by the FP8 GEMM tests (BF16 and F32 activations).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/gemm_fp8.h"

namespace moeserve::testing {

struct Fp8Problem {
  int64_t n, k;
  std::vector<uint8_t> w;    // [n, k] FP8
  std::vector<float> scale;  // [ceil(n/128), ceil(k/128)]
  PackedFp8Weight packed;
};

// Random FP8 bytes over the whole range (subnormals included), never NaN, never zero.
inline Fp8Problem make_fp8_problem(int64_t n, int64_t k, std::mt19937& rng) {
  Fp8Problem p{n, k, std::vector<uint8_t>(size_t(n * k)), {}, {}};
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : p.w) {
    do b = uint8_t(byte(rng));
    while ((b & 0x7f) == 0x7f || (b & 0x7f) == 0);
  }
  std::uniform_real_distribution<float> s(0.5e-3f, 4e-3f);
  p.scale.resize(size_t(((n + 127) / 128) * ((k + 127) / 128)));
  for (auto& v : p.scale) v = s(rng);
  p.packed = pack_fp8_weight(p.w.data(), p.scale.data(), n, k);
  return p;
}

}  // namespace moeserve::testing
