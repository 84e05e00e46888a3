// RoPE rotation, AVX2 level: rope_f32x.h on 8-lane ymm vectors. Compiled with -mavx2 -mfma
// -ffp-contract=off; runs only when cpu_isa() says so. Everything here has internal linkage (see
// cpu_features.h).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/rope.h"

namespace moeserve::rope_detail {
namespace {

#include "kernels/vec_avx2.h"

#include "kernels/rope_f32x.h"

}  // namespace

void rotate_avx2(const float* cos2, const float* sin2, int64_t dim, float* x, int64_t n_rows,
                 int64_t ld) {
  rotate_rows(cos2, sin2, dim, x, n_rows, ld);
}

}  // namespace moeserve::rope_detail
