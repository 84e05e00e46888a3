// RoPE rotation with AVX-512F: sixteen values (eight pairs) per step, each pair's partner
// brought alongside by an in-lane swap; products and sums rounded separately as in
// RopeTable::apply (this file is built with -ffp-contract=off), masked tails.
#include <immintrin.h>

#include "kernels/rope.h"

namespace moeserve::rope_detail {
namespace {

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
}

// (a, b) -> (a c - b s, b c + a s) per pair.
inline __m512 rotate(__m512 v, __m512 c, __m512 s) {
  const __m512 swapped = _mm512_permute_ps(v, 0xb1);  // (b, a) per pair
  return _mm512_add_ps(_mm512_mul_ps(v, c), _mm512_mul_ps(swapped, s));
}

}  // namespace

void rotate_avx512(const float* cos2, const float* sin2, int64_t dim, float* x, int64_t n_rows,
                   int64_t ld) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* v = x + r * ld;
    int64_t i = 0;
    for (; i + 16 <= dim; i += 16) {
      _mm512_storeu_ps(v + i, rotate(_mm512_loadu_ps(v + i), _mm512_loadu_ps(cos2 + i),
                                     _mm512_loadu_ps(sin2 + i)));
    }
    if (i < dim) {
      const __mmask16 m = tail_mask(dim - i);
      _mm512_mask_storeu_ps(
          v + i, m,
          rotate(_mm512_maskz_loadu_ps(m, v + i), _mm512_maskz_loadu_ps(m, cos2 + i),
                 _mm512_maskz_loadu_ps(m, sin2 + i)));
    }
  }
}

}  // namespace moeserve::rope_detail
