// silu(g) * u with AVX-512F, sixteen values per step (silu_mul.h). exp(x), x = -g clamped to
// [-80, 88.75]: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2 in two parts, the
// first with 9 significant bits so n * ln2_hi is exact), e^r = 1 + r + r^2 P(r) with P of degree
// 4 fitted here for minimax relative error (about 3e-9 before F32 rounding), then e^x =
// e^r * 2^(n-1) * 2, which reaches inf as std::exp does above ln(FLT_MAX). Below x = -80 the
// clamp changes nothing: 1 + e^x is already exactly 1 from x < -17. The AVX2 file runs the same
// operations (this one is built with -ffp-contract=off: every fused multiply-add is written out).
#include <immintrin.h>

#include <cstdint>

#include "kernels/silu_mul.h"

namespace moeserve::silu_mul_detail {
namespace {

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
}

inline __m512 silu_mul16(__m512 g, __m512 u) {
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 x = _mm512_sub_ps(_mm512_setzero_ps(), g);
  // max/min return their second operand for a NaN x: the exp stays finite, g / (1 + e) is NaN.
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-80.0f)), _mm512_set1_ps(88.75f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(0x1.715476p+0f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.63p-1f), x);  // x - n ln2_hi, exact
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-0x1.bd0106p-13f), r);   // - n ln2_lo
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0x1.6a243ep-10f), r, _mm512_set1_ps(0x1.1239d4p-7f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.5558f2p-5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.555492p-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.fffffcp-2f));
  const __m512 er = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), one);  // e^r
  // 2^(n-1): n in [-115, 128], so the biased exponent n + 126 is in [11, 254].
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(126)), 23);
  const __m512 e =
      _mm512_mul_ps(_mm512_mul_ps(er, _mm512_castsi512_ps(bits)), _mm512_set1_ps(2.0f));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u);
}

// 16 F32 -> 16 BF16 as core/dtype.h's f32_to_bf16 (round to nearest even, NaN quieted).
inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, quiet));
}

}  // namespace

void silu_mul_avx512(const float* g, const float* u, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, silu_mul16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(
        out + i, m, silu_mul16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

void silu_mul_bf16_avx512(const float* g, const float* u, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = silu_mul16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16(v));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = silu_mul16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i));
    _mm256_mask_storeu_epi16(out + i, m, to_bf16(v));
  }
}

}  // namespace moeserve::silu_mul_detail
