// gemm_fp8, AVX-512F level (no BF16 dot products): gemm_fp8_fma_body.h's rows form on 16-lane zmm
// vectors (F32 tile [128 k][64 cols], X widened to F32 per 6-row block, 6-row x 4-zmm register
// blocks). Compiled with -mavx512{f,bw,vl,dq} -mfma; runs only when cpu_isa() >= Isa::kAvx512.
// Everything here has internal linkage (see cpu_features.h).
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/gemm_fp8_internal.h"

namespace moeserve::gemm_detail {
namespace {

#include "kernels/vec_avx512f.h"

struct Form {
  static constexpr bool kBf16X = true;
  static constexpr bool kPairs = false;
  static constexpr int kConvRows = 0;
};

#include "kernels/gemm_fp8_fma_body.h"

}  // namespace

void panels_avx512(const GemmJob& job, int64_t p0, int64_t p1) {
  panels_fma(job, p0, p1);
}

}  // namespace moeserve::gemm_detail
