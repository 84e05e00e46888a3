// RMSNorm with AVX-512F: squares summed in FP64 over 32 interleaved partial sums (four vectors
// of eight), then y = (x * inv) * weight sixteen values at a time; masked tails (rmsnorm.h).
#include <immintrin.h>

#include "kernels/rmsnorm.h"

namespace moeserve::rmsnorm_detail {
namespace {

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
}

// acc += (double) v[0..7]^2 and (double) v[8..15]^2, lane by lane.
inline void add_squares(__m512 v, __m512d& lo, __m512d& hi) {
  const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  const __m512d b =
      _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  lo = _mm512_fmadd_pd(a, a, lo);  // each square is exact in FP64: fused or not, the same sum
  hi = _mm512_fmadd_pd(b, b, hi);
}

void row_partials(const float* x, int64_t dim, double* partial) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;  // elements i % 32 in 0-7 .. 24-31
  int64_t i = 0;
  for (; i + 32 <= dim; i += 32) {
    add_squares(_mm512_loadu_ps(x + i), a0, a1);
    add_squares(_mm512_loadu_ps(x + i + 16), a2, a3);
  }
  if (i < dim) {  // zeros past the end add nothing
    add_squares(_mm512_maskz_loadu_ps(tail_mask(dim - i), x + i), a0, a1);
    if (i + 16 < dim)
      add_squares(_mm512_maskz_loadu_ps(tail_mask(dim - i - 16), x + i + 16), a2, a3);
  }
  _mm512_storeu_pd(partial, a0);
  _mm512_storeu_pd(partial + 8, a1);
  _mm512_storeu_pd(partial + 16, a2);
  _mm512_storeu_pd(partial + 24, a3);
}

}  // namespace

void rmsnorm_avx512(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                    float eps, float* y, int64_t ldy) {
  alignas(64) double partial[kPartials];
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    row_partials(xr, dim, partial);
    const __m512 inv = _mm512_set1_ps(inv_rms(partial, dim, eps));
    int64_t i = 0;
    for (; i + 16 <= dim; i += 16) {
      const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xr + i), inv);
      _mm512_storeu_ps(yr + i, _mm512_mul_ps(v, _mm512_loadu_ps(weight + i)));
    }
    if (i < dim) {
      const __mmask16 m = tail_mask(dim - i);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), inv);
      _mm512_mask_storeu_ps(yr + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + i)));
    }
  }
}

}  // namespace moeserve::rmsnorm_detail
