// silu(g) * u, AVX2 level: silu_mul_f32x.h on 8-lane ymm vectors. Compiled with -mavx2 -mfma
// -ffp-contract=off; runs only when cpu_isa() says so. Everything here has internal linkage (see
// cpu_features.h).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/silu_mul.h"

namespace moeserve::silu_mul_detail {
namespace {

#include "kernels/vec_avx2.h"

#include "kernels/silu_mul_f32x.h"

}  // namespace

void silu_mul_avx2(const float* g, const float* u, int64_t n, float* out) {
  silu_mul_to_f32(g, u, n, out);
}

void silu_mul_bf16_avx2(const float* g, const float* u, int64_t n, uint16_t* out) {
  silu_mul_to_bf16(g, u, n, out);
}

}  // namespace moeserve::silu_mul_detail
