#include "kernels/silu_mul.h"

#include <cmath>

#include "core/dtype.h"

namespace moeserve {

void silu_mul_ref(const float* g, const float* u, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void silu_mul_bf16_ref(const float* g, const float* u, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(g[i] / (1.0f + std::exp(-g[i])) * u[i]);
}

void silu_mul(const float* g, const float* u, int64_t n, float* out, Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
    case Isa::kAvx512Bf16:
    case Isa::kAmx:
      return silu_mul_detail::silu_mul_avx512(g, u, n, out);
    case Isa::kAvx2:
      return silu_mul_detail::silu_mul_avx2(g, u, n, out);
    case Isa::kScalar:
      break;
  }
  silu_mul_ref(g, u, n, out);
}

void silu_mul_bf16(const float* g, const float* u, int64_t n, uint16_t* out, Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
    case Isa::kAvx512Bf16:
    case Isa::kAmx:
      return silu_mul_detail::silu_mul_bf16_avx512(g, u, n, out);
    case Isa::kAvx2:
      return silu_mul_detail::silu_mul_bf16_avx2(g, u, n, out);
    case Isa::kScalar:
      break;
  }
  silu_mul_bf16_ref(g, u, n, out);
}

}  // namespace moeserve
