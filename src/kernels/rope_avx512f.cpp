// RoPE rotation, AVX-512F level: rope_f32x.h on 16-lane zmm vectors. Compiled with
// -mavx512{f,bw,vl,dq} -mfma -ffp-contract=off; runs only when cpu_isa() says so. Everything here
// has internal linkage (see cpu_features.h).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/rope.h"

namespace moeserve::rope_detail {
namespace {

#include "kernels/vec_avx512f.h"

#include "kernels/rope_f32x.h"

}  // namespace

void rotate_avx512(const float* cos2, const float* sin2, int64_t dim, float* x, int64_t n_rows,
                   int64_t ld) {
  rotate_rows(cos2, sin2, dim, x, n_rows, ld);
}

}  // namespace moeserve::rope_detail
