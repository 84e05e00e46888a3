// Row conversions with AVX-512F/BW: 16 values per step, masked tails, the same bits as the
// scalar reference (convert.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/convert.h"

namespace moeserve::convert_detail {
namespace {

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
}

inline __m512 load_bf16(const uint16_t* p, __mmask16 m) {
  __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

// e4m3 bytes -> F32: the exponent and mantissa bits (b & 0x7f) placed at bit 20 are an F32 of
// value(b) * 2^-120, normal and subnormal alike; one exact multiply by 2^120 restores it.
// 0x7f / 0xff are NaN, as in fp8e4m3_table().
inline __m512 e4m3_to_f32(__m128i bytes) {
  const __m512i b = _mm512_cvtepu8_epi32(bytes);
  const __m512i low = _mm512_and_si512(b, _mm512_set1_epi32(0x7f));
  __m512 v =
      _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(low, 20)), _mm512_set1_ps(0x1p120f));
  const __mmask16 nan = _mm512_cmpeq_epi32_mask(low, _mm512_set1_epi32(0x7f));
  v = _mm512_mask_mov_ps(v, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
}

// 16 F32 bit patterns -> 16 BF16 (round to nearest even, NaN quieted).
inline __m256i f32_bits_to_bf16(__m512i u) {
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, quiet));
}

}  // namespace

void fp8_1x128_to_f32_avx512(const uint8_t* q, const float* scales, int64_t n, float* out) {
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m512 s = _mm512_set1_ps(scales[c / 128]);  // 16 | 128: one block per step
    const __m512 v = e4m3_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c)));
    _mm512_storeu_ps(out + c, _mm512_mul_ps(v, s));
  }
  if (c < n) {
    const __mmask16 m = tail_mask(n - c);
    const __m512 s = _mm512_set1_ps(scales[c / 128]);
    const __m512 v = e4m3_to_f32(_mm_maskz_loadu_epi8(m, q + c));
    _mm512_mask_storeu_ps(out + c, m, _mm512_mul_ps(v, s));
  }
}

void bf16_to_f32_avx512(const uint16_t* x, int64_t n, float* out) {
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) _mm512_storeu_ps(out + c, load_bf16(x + c, __mmask16(0xffff)));
  if (c < n) {
    const __mmask16 m = tail_mask(n - c);
    _mm512_mask_storeu_ps(out + c, m, load_bf16(x + c, m));
  }
}

void bf16_axpy_avx512(float w, const uint16_t* x, int64_t n, float* y) {
  const __m512 wv = _mm512_set1_ps(w);
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m512 p = _mm512_mul_ps(wv, load_bf16(x + c, __mmask16(0xffff)));  // not fused
    _mm512_storeu_ps(y + c, _mm512_add_ps(_mm512_loadu_ps(y + c), p));
  }
  if (c < n) {
    const __mmask16 m = tail_mask(n - c);
    const __m512 p = _mm512_mul_ps(wv, load_bf16(x + c, m));  // not fused: see CMakeLists
    _mm512_mask_storeu_ps(y + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + c), p));
  }
}

void f32_to_bf16_avx512(const float* x, int64_t n, uint16_t* out) {
  int64_t c = 0;
  // Whole vectors with plain loads and stores (masked stores are slow on some cores).
  for (; c + 16 <= n; c += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x + c));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), f32_bits_to_bf16(u));
  }
  if (c < n) {
    const __mmask16 m = tail_mask(n - c);
    const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + c));
    _mm256_mask_storeu_epi16(out + c, m, f32_bits_to_bf16(u));
  }
}

void bf16_round_axpy_avx512(float w, const float* x, int64_t n, float* y) {
  const __m512 wv = _mm512_set1_ps(w);
  // x rounded to BF16 and widened back (what load_bf16 would read from the rounded row), in the
  // F32 lanes: f32_bits_to_bf16's arithmetic with the low half masked off instead of shifted.
  auto rounded = [](__m512 v) {
    const __m512i u = _mm512_castps_si512(v), high = _mm512_set1_epi32(int32_t(0xffff0000u));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_and_si512(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), high);
    const __m512i quiet = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), high);
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(r, nan, quiet));
  };
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m512 p = _mm512_mul_ps(wv, rounded(_mm512_loadu_ps(x + c)));  // not fused
    _mm512_storeu_ps(y + c, _mm512_add_ps(_mm512_loadu_ps(y + c), p));
  }
  if (c < n) {
    const __mmask16 m = tail_mask(n - c);
    const __m512 p = _mm512_mul_ps(wv, rounded(_mm512_maskz_loadu_ps(m, x + c)));
    _mm512_mask_storeu_ps(y + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + c), p));
  }
}

void fp8_1x128_to_bf16_avx512(const uint8_t* q, const float* scales, int64_t n, uint16_t* out) {
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m512 s = _mm512_set1_ps(scales[c / 128]);  // 16 | 128: one block per step
    const __m512 v = e4m3_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c),
                        f32_bits_to_bf16(_mm512_castps_si512(_mm512_mul_ps(v, s))));
  }
  if (c < n) {
    const __mmask16 m = tail_mask(n - c);
    const __m512 s = _mm512_set1_ps(scales[c / 128]);
    const __m512 v = e4m3_to_f32(_mm_maskz_loadu_epi8(m, q + c));
    _mm256_mask_storeu_epi16(out + c, m,
                             f32_bits_to_bf16(_mm512_castps_si512(_mm512_mul_ps(v, s))));
  }
}

}  // namespace moeserve::convert_detail
