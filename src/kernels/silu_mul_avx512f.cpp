// silu(g) * u, AVX-512F level: silu_mul_f32x.h on 16-lane zmm vectors. Compiled with
// -mavx512{f,bw,vl,dq} -mfma -ffp-contract=off; runs only when cpu_isa() says so. Everything here
// has internal linkage (see cpu_features.h).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/silu_mul.h"

namespace moeserve::silu_mul_detail {
namespace {

#include "kernels/vec_avx512f.h"

#include "kernels/silu_mul_f32x.h"

}  // namespace

void silu_mul_avx512(const float* g, const float* u, int64_t n, float* out) {
  silu_mul_to_f32(g, u, n, out);
}

void silu_mul_bf16_avx512(const float* g, const float* u, int64_t n, uint16_t* out) {
  silu_mul_to_bf16(g, u, n, out);
}

}  // namespace moeserve::silu_mul_detail
