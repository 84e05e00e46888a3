// RMSNorm with AVX2: the AVX-512 kernel's arithmetic (rmsnorm_avx512f.cpp) on 256-bit vectors,
// squares summed in FP64 over the same 32 interleaved partial sums (eight vectors of four), so
// both levels give the same bits (rmsnorm.h).
#include <immintrin.h>

#include "kernels/rmsnorm.h"

namespace moeserve::rmsnorm_detail {
namespace {

// Lanes [0, left) set (all eight for left >= 8): the mask of _mm256_maskload_ps/maskstore_ps.
inline __m256i tail_mask(int64_t left) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(left < 8 ? left : 8)), lane);
}

inline void add_squares(__m256 v, __m256d& lo, __m256d& hi) {
  const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
  const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
  lo = _mm256_fmadd_pd(a, a, lo);  // exact squares: see rmsnorm_avx512f.cpp
  hi = _mm256_fmadd_pd(b, b, hi);
}

void row_partials(const float* x, int64_t dim, double* partial) {
  __m256d a[8];  // a[k]: elements with i % 32 in [4k, 4k + 4)
  for (__m256d& v : a) v = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 32 <= dim; i += 32) {
    for (int k = 0; k < 4; ++k) add_squares(_mm256_loadu_ps(x + i + 8 * k), a[2 * k], a[2 * k + 1]);
  }
  for (int k = 0; k < 4 && i + 8 * k < dim; ++k) {  // the tail, zeros past the end
    add_squares(_mm256_maskload_ps(x + i + 8 * k, tail_mask(dim - i - 8 * k)), a[2 * k],
                a[2 * k + 1]);
  }
  for (int k = 0; k < 8; ++k) _mm256_storeu_pd(partial + 4 * k, a[k]);
}

}  // namespace

void rmsnorm_avx2(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                  float eps, float* y, int64_t ldy) {
  alignas(32) double partial[kPartials];
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    row_partials(xr, dim, partial);
    const __m256 inv = _mm256_set1_ps(inv_rms(partial, dim, eps));
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xr + i), inv);
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(v, _mm256_loadu_ps(weight + i)));
    }
    if (i < dim) {
      const __m256i m = tail_mask(dim - i);
      const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(xr + i, m), inv);
      _mm256_maskstore_ps(yr + i, m, _mm256_mul_ps(v, _mm256_maskload_ps(weight + i, m)));
    }
  }
}

}  // namespace moeserve::rmsnorm_detail
