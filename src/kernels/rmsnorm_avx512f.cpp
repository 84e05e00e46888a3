// RMSNorm, AVX-512F level: rmsnorm_f32x.h on 16-lane zmm vectors. Compiled with
// -mavx512{f,bw,vl,dq} -mfma -ffp-contract=off; runs only when cpu_isa() says so. Everything here
// has internal linkage (see cpu_features.h).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/rmsnorm.h"

namespace moeserve::rmsnorm_detail {
namespace {

#include "kernels/vec_avx512f.h"

#include "kernels/rmsnorm_f32x.h"

}  // namespace

void rmsnorm_avx512(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                    float eps, float* y, int64_t ldy) {
  rmsnorm_rows(x, n_rows, dim, ldx, weight, eps, y, ldy);
}

}  // namespace moeserve::rmsnorm_detail
