// RMSNorm, AVX2 level: rmsnorm_f32x.h on 8-lane ymm vectors. Compiled with -mavx2 -mfma
// -ffp-contract=off; runs only when cpu_isa() says so. Everything here has internal linkage (see
// cpu_features.h).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/rmsnorm.h"

namespace moeserve::rmsnorm_detail {
namespace {

#include "kernels/vec_avx2.h"

#include "kernels/rmsnorm_f32x.h"

}  // namespace

void rmsnorm_avx2(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                  float eps, float* y, int64_t ldy) {
  rmsnorm_rows(x, n_rows, dim, ldx, weight, eps, y, ldy);
}

}  // namespace moeserve::rmsnorm_detail
