// quantize_fp8_1x128 (BF16 rows) and quantize_fp8_1x128_f32 (F32 rows rounded to BF16 in
// registers) with AVX-512F/BW: 16 values per step, bit-identical to the reference (same F32
// operations; the e4m3 rounding below mirrors f32_to_fp8e4m3 in core/dtype.h).
#include <immintrin.h>

#include <cstdint>

#include "kernels/quant.h"

namespace moeserve::quant_detail {
namespace {

inline __m512 load_bf16(const uint16_t* p, __mmask16 m) {
  __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

// F32 -> e4m3 bytes in the low 8 bits of each lane (round to nearest even, saturate at 448).
inline __m512i f32_to_e4m3(__m512 f) {
  __m512i u = _mm512_castps_si512(f);
  __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
  __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  __m512 af = _mm512_castsi512_ps(a);
  // Normal range: round the 23-bit mantissa to 3 bits, rebias 127 -> 7, clamp to 0x7e.
  __m512i r = _mm512_add_epi32(
      a, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff),
                          _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1))));
  __m512i code = _mm512_sub_epi32(_mm512_srli_epi32(r, 20), _mm512_set1_epi32(120 << 3));
  code = _mm512_min_epi32(code, _mm512_set1_epi32(0x7e));
  // Below 2^-6: multiples of 2^-9, rounded to nearest even by the default MXCSR mode.
  __mmask16 small = _mm512_cmp_ps_mask(af, _mm512_set1_ps(0.015625f), _CMP_LT_OQ);
  code = _mm512_mask_mov_epi32(code, small,
                               _mm512_cvtps_epi32(_mm512_mul_ps(af, _mm512_set1_ps(512.0f))));
  __mmask16 big = _mm512_cmp_ps_mask(af, _mm512_set1_ps(448.0f), _CMP_GE_OQ);
  code = _mm512_mask_mov_epi32(code, big, _mm512_set1_epi32(0x7e));
  __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
  code = _mm512_mask_mov_epi32(code, nan, _mm512_set1_epi32(0x7f));
  return _mm512_or_si512(code, sign);
}

// 16 F32 values rounded to BF16 (nearest even; a NaN stays a quiet NaN), as F32: the value
// load_bf16 gives on f32_to_bf16's bits.
inline __m512 load_f32_as_bf16(const float* p, __mmask16 m) {
  __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, p));
  __m512i r = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                          _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                          _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(int(0xffff0000u))));
}

inline __m512 load_row(const uint16_t* p, __mmask16 m) {
  return load_bf16(p, m);
}
inline __m512 load_row(const float* p, __mmask16 m) {
  return load_f32_as_bf16(p, m);
}

template <typename T>  // uint16_t (BF16 bits) or float
void quantize_rows(const T* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q, int64_t ldq,
                   float* scales) {
  const int64_t groups = (cols + 127) / 128;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * ldx;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * 128, c1 = cols < c0 + 128 ? cols : c0 + 128;
      __m512 amax = _mm512_set1_ps(1e-4f);
      for (int64_t c = c0; c < c1; c += 16) {
        __mmask16 m = c1 - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (c1 - c)) - 1);
        __m512 a = _mm512_abs_ps(load_row(xr + c, m));
        amax = _mm512_max_ps(a, amax);  // a NaN lane keeps amax, as the reference does
      }
      const float am = _mm512_reduce_max_ps(amax);
      const float inv = 448.0f / am;
      const __m512 vinv = _mm512_set1_ps(inv);
      for (int64_t c = c0; c < c1; c += 16) {
        __mmask16 m = c1 - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (c1 - c)) - 1);
        __m512i code = f32_to_e4m3(_mm512_mul_ps(load_row(xr + c, m), vinv));
        _mm_mask_storeu_epi8(q + r * ldq + c, m, _mm512_cvtepi32_epi8(code));
      }
      scales[r * groups + g] = am / 448.0f;
    }
  }
}

}  // namespace

void quantize_avx512(const uint16_t* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                     int64_t ldq, float* scales) {
  quantize_rows(x, rows, cols, ldx, q, ldq, scales);
}

void quantize_f32_avx512(const float* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                         int64_t ldq, float* scales) {
  quantize_rows(x, rows, cols, ldx, q, ldq, scales);
}

}  // namespace moeserve::quant_detail
