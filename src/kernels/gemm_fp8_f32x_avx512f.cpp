// gemm_fp8_f32x, AVX-512F level: gemm_fp8_fma_body.h's pairs form on 16-lane zmm vectors (FP8
// through FP16, lanes of (column, k parity) partial sums, 6-row x 4-zmm register blocks per half
// panel) with the tile converted in registers up to 4 rows (16 accumulators + 8 W + 3 registers).
// Compiled with -mavx512{f,bw,vl,dq} -mfma; runs only when cpu_isa() >= Isa::kAvx512. Everything
// here has internal linkage (see cpu_features.h).
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/gemm_fp8_internal.h"

namespace moeserve::gemm_detail {
namespace {

#include "kernels/vec_avx512f.h"

struct Form {
  static constexpr bool kBf16X = false;
  static constexpr bool kPairs = true;
  static constexpr int kConvRows = 4;
};

#include "kernels/gemm_fp8_fma_body.h"

}  // namespace

void panels_f32x_avx512(const GemmJob& job, int64_t p0, int64_t p1) {
  panels_fma(job, p0, p1);
}

}  // namespace moeserve::gemm_detail
