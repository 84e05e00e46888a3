// gemm_fp8_f32x, AVX2+FMA level: gemm_fp8_fma_body.h's rows form on 8-lane ymm vectors (F32
// tile [128 k][64 cols], 4-row x 2-ymm register blocks over the panel's four 16-column slices).
// Compiled with -mavx2 -mfma; runs only when cpu_isa() >= Isa::kAvx2. Everything here has internal
// linkage (see cpu_features.h).
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/gemm_fp8_internal.h"

namespace moeserve::gemm_detail {
namespace {

#include "kernels/vec_avx2.h"

struct Form {
  static constexpr bool kBf16X = false;
  static constexpr bool kPairs = false;
  static constexpr int kConvRows = 0;
};

#include "kernels/gemm_fp8_fma_body.h"

}  // namespace

void panels_f32x_avx2(const GemmJob& job, int64_t p0, int64_t p1) {
  panels_fma(job, p0, p1);
}

}  // namespace moeserve::gemm_detail
