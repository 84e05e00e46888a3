// The AVX-512F vector type of the F32 kernel bodies (mla_decode_f32x.h, gemm_fp8_fma_body.h,
// rmsnorm_f32x.h, rope_f32x.h, silu_mul_f32x.h): 16 floats in a zmm, 32 registers. vec_avx2.h is
// its AVX2 twin with the same ops; every op gives the same bits in both but exp2 (see there).
//
// How to use: include only from AVX-512 translation units (*_avx512f.cpp; mla_decode_avx512.cpp
// for exp2), inside their anonymous namespace (so the linker can never give a baseline caller
// this copy: cpu_features.h), after <immintrin.h>, <cstdint> and <cstring>, then the kernel
// body. No includes of its own.
#pragma once

struct Vec {
  using T = __m512;   // kLanes floats
  using D = __m512d;  // kLanes / 2 doubles
  static constexpr int64_t kLanes = 16;
  static constexpr int kRegs = 32;

  // Arithmetic; load/store need 64-byte alignment, loadu/storeu none.
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float f) { return _mm512_set1_ps(f); }
  static T load(const float* p) { return _mm512_load_ps(p); }
  static T loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_store_ps(p, v); }
  static void storeu(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T bcast(const float* p) { return _mm512_set1_ps(*p); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  // min, max: b where either is NaN.
  static T min(T a, T b) { return _mm512_min_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }    // a b + c
  static T fnmadd(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
  // To nearest even.
  static T round(T x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // The float whose biased exponent is int(n) + bias, mantissa 0: 2^(n + bias - 127) for an
  // integral n with int(n) + bias in [1, 254] (0 gives exactly 0).
  static T pow2(T n, int bias) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(bias)), 23));
  }

  // The first n lanes (all for n >= kLanes): loads give 0 elsewhere and read nothing past them.
  static T loadu_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static void storeu_n(float* p, T v, int64_t n) { _mm512_mask_storeu_ps(p, first(n), v); }

  // BF16 as core/dtype.h's f32_to_bf16 (round to nearest even, NaN quieted): kLanes values, or
  // the first n.
  static void storeu_bf16(uint16_t* p, T v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(v));
  }
  static void storeu_bf16_n(uint16_t* p, T v, int64_t n) {
    _mm256_mask_storeu_epi16(p, first(n), to_bf16(v));
  }
  // dst[i] = the F32 value of bf16[i], i < n (exact: the high half of the F32); dst aligned.
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

  // Interleaved pairs (x[2i], x[2i+1]).
  static T swap_pairs(T v) { return _mm512_permute_ps(v, 0xb1); }  // (b, a) per pair
  // (p[0], p[1]) repeated.
  static T bcast_pair(const float* p) {
    double d;
    std::memcpy(&d, p, 8);
    return _mm512_castpd_ps(_mm512_set1_pd(d));
  }
  // a and b hold kLanes / 2 pairs each: the kLanes pair sums, a's first.
  static T add_pairs(T a, T b) {
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd =
        _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return _mm512_add_ps(_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b));
  }

  // FP8 e4m3 weights in the packed order (pairs of k per column, gemm_fp8.h).
  // (GCC 12's _mm512_cvtph_ps passes _mm512_undefined_ps(), a self-initialized variable, and
  // trips -Wuninitialized once inlined: GCC bug 105593, as -Wmaybe-uninitialized elsewhere.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
  // kLanes bytes -> kLanes floats in the same order, each the value times 2^-8, through FP16:
  // vpmovsxbw + (<< 7) puts sign | eeee mmm where FP16 has them and a copy of the sign at bit 14,
  // which the mask clears; FP8 subnormals land on FP16 subnormals and vcvtph2ps is exact, so no
  // F32 subnormal is ever formed (docs/kernels-gemm.md).
  static T fp8_pairs(const uint8_t* p) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtph_ps(
        _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(short(0xbf80))));
  }
#pragma GCC diagnostic pop
  // 2 kLanes bytes (kLanes columns x k even, odd) -> the two rows, exact: the sign-extended byte
  // shifted so sign | eeee mmm sits at bits 31 and 26..20, times 2^120 (NaN bytes read +-480).
  static void fp8_rows(const uint8_t* p, T& even, T& odd) {
    const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512i mask = _mm512_set1_epi32(int(0x87f00000u));
    const T two120 = _mm512_set1_ps(0x1p120f);
    const __m512i e = _mm512_and_si512(_mm512_slli_epi32(w, 20), mask);  // low word's byte
    const __m512i o = _mm512_and_si512(_mm512_slli_epi32(w, 4), mask);   // high word's
    even = _mm512_mul_ps(_mm512_castsi512_ps(e), two120);
    odd = _mm512_mul_ps(_mm512_castsi512_ps(o), two120);
  }
  // The same for 2 kLanes BF16 values: each 32-bit pair holds k even low, k odd high.
  static void bf16_rows(const uint16_t* p, T& even, T& odd) {
    const __m512i v = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  }

  // Doubles: lanes [0, kLanes / 2) or [kLanes / 2, kLanes) of v, widened (exact).
  static D lo_f64(T v) {
    return _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  }
  static D hi_f64(T v) {
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
  static D dzero() {
    return _mm512_setzero_pd();
  }
  static D dfmadd(D a, D b, D c) {
    return _mm512_fmadd_pd(a, b, c);
  }
  static void dstoreu(double* p, D v) {
    _mm512_storeu_pd(p, v);
  }

  // mla_decode's softmax.
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
  // v in lanes with lim > t, -inf elsewhere (lim aligned).
  static T visible(const int32_t* lim, int64_t t, T v) {
    const __mmask16 k = _mm512_cmpgt_epi32_mask(_mm512_load_si512(lim), _mm512_set1_epi32(int(t)));
    return _mm512_mask_blend_ps(k, _mm512_set1_ps(-__builtin_inff()), v);
  }
  static T zero_where_ninf(T m) {  // 0 in lanes where m = -inf
    const __mmask16 k = _mm512_cmp_ps_mask(m, _mm512_set1_ps(-__builtin_inff()), _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(k, m, _mm512_setzero_ps());
  }

 private:
  static __mmask16 first(int64_t n) {
    return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u);
  }
  static __m256i to_bf16(T v) {
    const __m512i u = _mm512_castps_si512(v);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, quiet));
  }
};
