// mla_decode, AVX-512F level: the FP32 piece kernel (mla_decode_f32x.h) on 16-lane zmm vectors
// with 32 registers (24-accumulator register blocks). Compiled with -mavx512{f,bw,vl,dq} -mfma;
// runs only when cpu_isa() says so. Everything here has internal linkage (see cpu_features.h).
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cstdint>

#include "kernels/mla_decode_internal.h"

namespace moeserve::mla_detail {
namespace {

struct Vec {
  using T = __m512;
  static constexpr int64_t kLanes = 16;
  static constexpr int kRegs = 32;
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float f) { return _mm512_set1_ps(f); }
  static T load(const float* p) { return _mm512_load_ps(p); }
  static void store(float* p, T v) { _mm512_store_ps(p, v); }
  static void storeu(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T bcast(const float* p) { return _mm512_set1_ps(*p); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }

  // 2^round(x) * p(frac), p a degree-6 Taylor polynomial of 2^f on [-0.5, 0.5] (relative error
  // < 2e-7); x is clamped at -200, where scalef gives exactly 0.
  static T exp2(T x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-200.0f));
    const T n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const T f = _mm512_sub_ps(x, n);
    T p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2402265069591007f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471805599453f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
  }
  static T visible(const int32_t* lim, int64_t t, T v) {
    const __mmask16 k = _mm512_cmpgt_epi32_mask(_mm512_load_si512(lim), _mm512_set1_epi32(int(t)));
    return _mm512_mask_blend_ps(k, _mm512_set1_ps(-__builtin_inff()), v);
  }
  static T zero_where_ninf(T m) {
    const __mmask16 k = _mm512_cmp_ps_mask(m, _mm512_set1_ps(-__builtin_inff()), _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(k, m, _mm512_setzero_ps());
  }
  static void widen(const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm512_store_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    if (i < n) {
      const __mmask16 k = __mmask16((1u << (n - i)) - 1);
      const __m256i h = _mm256_maskz_loadu_epi16(k, src + i);
      _mm512_mask_storeu_epi32(dst + i, k, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
};

#include "kernels/mla_decode_f32x.h"

}  // namespace

void piece_avx512f(const Ctx& ctx, const Piece& piece) {
  piece_f32(ctx, piece);
}

}  // namespace moeserve::mla_detail
