// silu(g) * u with AVX2, eight values per step: silu_mul_avx512f.cpp's operations one for one
// (see there for the exp), so both levels give the same bits (built with -ffp-contract=off).
#include <immintrin.h>

#include <cstdint>

#include "kernels/silu_mul.h"

namespace moeserve::silu_mul_detail {
namespace {

inline __m256i tail_mask(int64_t left) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(left < 8 ? left : 8)), lane);
}

inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 x = _mm256_sub_ps(_mm256_setzero_ps(), g);
  // max/min return their second operand for a NaN x (as the AVX-512 forms do).
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-80.0f)), _mm256_set1_ps(88.75f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(0x1.715476p+0f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.63p-1f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-0x1.bd0106p-13f), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(0x1.6a243ep-10f), r, _mm256_set1_ps(0x1.1239d4p-7f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0x1.5558f2p-5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0x1.555492p-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0x1.fffffcp-2f));
  const __m256 er = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), one);
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
  const __m256 e =
      _mm256_mul_ps(_mm256_mul_ps(er, _mm256_castsi256_ps(bits)), _mm256_set1_ps(2.0f));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
}

// 8 F32 -> 8 BF16 (round to nearest even, NaN quieted), in the low 128 bits.
inline __m128i to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  // |u| > 0x7f800000 as signed compare: both sides are non-negative 31-bit values.
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i w = _mm256_blendv_epi8(r, quiet, nan);  // 16-bit values in 32-bit lanes
  const __m256i packed = _mm256_packus_epi32(w, w);     // per 128-bit half: 4 values, twice
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));  // halves' lows
}

}  // namespace

void silu_mul_avx2(const float* g, const float* u, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  }
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(out + i, m,
                        silu_mul8(_mm256_maskload_ps(g + i, m), _mm256_maskload_ps(u + i, m)));
  }
}

void silu_mul_bf16_avx2(const float* g, const float* u, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), to_bf16(v));
  }
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    alignas(16) uint16_t tmp[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp),
                    to_bf16(silu_mul8(_mm256_maskload_ps(g + i, m), _mm256_maskload_ps(u + i, m))));
    for (int64_t j = 0; j < n - i; ++j) out[i + j] = tmp[j];
  }
}

}  // namespace moeserve::silu_mul_detail
