// RoPE rotation with AVX2: rope_avx512f.cpp on eight values (four pairs) per step; the same
// bits as RopeTable::apply (built with -ffp-contract=off).
#include <immintrin.h>

#include "kernels/rope.h"

namespace moeserve::rope_detail {
namespace {

inline __m256i tail_mask(int64_t left) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(left < 8 ? left : 8)), lane);
}

inline __m256 rotate(__m256 v, __m256 c, __m256 s) {
  const __m256 swapped = _mm256_permute_ps(v, 0xb1);  // (b, a) per pair
  return _mm256_add_ps(_mm256_mul_ps(v, c), _mm256_mul_ps(swapped, s));
}

}  // namespace

void rotate_avx2(const float* cos2, const float* sin2, int64_t dim, float* x, int64_t n_rows,
                 int64_t ld) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* v = x + r * ld;
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8) {
      _mm256_storeu_ps(v + i, rotate(_mm256_loadu_ps(v + i), _mm256_loadu_ps(cos2 + i),
                                     _mm256_loadu_ps(sin2 + i)));
    }
    if (i < dim) {
      const __m256i m = tail_mask(dim - i);
      _mm256_maskstore_ps(v + i, m,
                          rotate(_mm256_maskload_ps(v + i, m), _mm256_maskload_ps(cos2 + i, m),
                                 _mm256_maskload_ps(sin2 + i, m)));
    }
  }
}

}  // namespace moeserve::rope_detail
