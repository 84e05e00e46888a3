// mla_decode, AVX2 level: the FP32 piece kernel (mla_decode_f32x.h) on 8-lane ymm vectors with
// 16 registers (12-accumulator register blocks). Compiled with -mavx2 -mfma; runs only when
// cpu_isa() says so. Everything here has internal linkage (see cpu_features.h).
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cstdint>

#include "kernels/mla_decode_internal.h"

namespace moeserve::mla_detail {
namespace {

struct Vec {
  using T = __m256;
  static constexpr int64_t kLanes = 8;
  static constexpr int kRegs = 16;
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float f) { return _mm256_set1_ps(f); }
  static T load(const float* p) { return _mm256_load_ps(p); }
  static void store(float* p, T v) { _mm256_store_ps(p, v); }
  static void storeu(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }

  // 2^round(x) * p(frac), p a degree-6 Taylor polynomial of 2^f on [-0.5, 0.5] (relative error
  // < 2e-7). x is clamped at -127, whose biased exponent 0 makes 2^n exactly 0: weights below
  // 2^-126 of the row's largest are dropped (and -inf gives 0, never NaN).
  static T exp2(T x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-127.0f));
    const T n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const T f = _mm256_sub_ps(x, n);
    T p = _mm256_set1_ps(1.5403530393381606e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129107628477e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866482158e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.2402265069591007f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931471805599453f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }
  static T visible(const int32_t* lim, int64_t t, T v) {
    const __m256i k = _mm256_cmpgt_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(lim)),
                                         _mm256_set1_epi32(int(t)));
    return _mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()), v, _mm256_castsi256_ps(k));
  }
  static T zero_where_ninf(T m) {
    const T k = _mm256_cmp_ps(m, _mm256_set1_ps(-__builtin_inff()), _CMP_EQ_OQ);
    return _mm256_andnot_ps(k, m);
  }
  static void widen(const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + i),
                         _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    for (; i < n; ++i) {
      const uint32_t bits = uint32_t(src[i]) << 16;
      memcpy(dst + i, &bits, 4);
    }
  }
};

#include "kernels/mla_decode_f32x.h"

}  // namespace

void piece_avx2(const Ctx& ctx, const Piece& piece) {
  piece_f32(ctx, piece);
}

}  // namespace moeserve::mla_detail
