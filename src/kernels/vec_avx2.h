// The AVX2 vector type of the F32 kernel bodies (mla_decode_f32x.h, gemm_fp8_fma_body.h,
// rmsnorm_f32x.h, rope_f32x.h, silu_mul_f32x.h): 8 floats in a ymm, 16 registers. The ops of
// vec_avx512f.h, with the same bits but exp2 (which drops weights below 2^-126 here).
//
// How to use: include only from *_avx2.cpp files, inside their anonymous namespace (so the linker
// can never give a baseline caller this copy: cpu_features.h), after <immintrin.h>, <cstdint> and
// <cstring>, then the kernel body. No includes of its own.
#pragma once

struct Vec {
  using T = __m256;   // kLanes floats
  using D = __m256d;  // kLanes / 2 doubles
  static constexpr int64_t kLanes = 8;
  static constexpr int kRegs = 16;

  // Arithmetic; load/store need 32-byte alignment, loadu/storeu none.
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float f) { return _mm256_set1_ps(f); }
  static T load(const float* p) { return _mm256_load_ps(p); }
  static T loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_store_ps(p, v); }
  static void storeu(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  // min, max: b where either is NaN.
  static T min(T a, T b) { return _mm256_min_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }    // a b + c
  static T fnmadd(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a b
  // To nearest even.
  static T round(T x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // The float whose biased exponent is int(n) + bias, mantissa 0: 2^(n + bias - 127) for an
  // integral n with int(n) + bias in [1, 254] (0 gives exactly 0).
  static T pow2(T n, int bias) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(bias)), 23));
  }

  // The first n lanes (all for n >= kLanes): loads give 0 elsewhere and read nothing past them.
  static T loadu_n(const float* p, int64_t n) { return _mm256_maskload_ps(p, first(n)); }
  static void storeu_n(float* p, T v, int64_t n) { _mm256_maskstore_ps(p, first(n), v); }

  // BF16 as core/dtype.h's f32_to_bf16 (round to nearest even, NaN quieted): kLanes values, or
  // the first n.
  static void storeu_bf16(uint16_t* p, T v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(v));
  }
  static void storeu_bf16_n(uint16_t* p, T v, int64_t n) {
    alignas(16) uint16_t tmp[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), to_bf16(v));
    for (int64_t j = 0; j < n && j < 8; ++j) p[j] = tmp[j];
  }
  // dst[i] = the F32 value of bf16[i], i < n (exact: the high half of the F32); dst aligned.
  static void widen(const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + i),
                         _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    for (; i < n; ++i) {
      const uint32_t bits = uint32_t(src[i]) << 16;
      std::memcpy(dst + i, &bits, 4);
    }
  }

  // Interleaved pairs (x[2i], x[2i+1]).
  static T swap_pairs(T v) { return _mm256_permute_ps(v, 0xb1); }  // (b, a) per pair
  // (p[0], p[1]) repeated.
  static T bcast_pair(const float* p) {
    double d;
    std::memcpy(&d, p, 8);
    return _mm256_castpd_ps(_mm256_set1_pd(d));
  }
  // a and b hold kLanes / 2 pairs each: the kLanes pair sums, a's first. The shuffles leave the
  // sums in 64-bit order 0, 2, 1, 3; the permute puts them back.
  static T add_pairs(T a, T b) {
    const T s = _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xdd));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), 0xd8));
  }

  // FP8 e4m3 weights in the packed order (pairs of k per column, gemm_fp8.h).
  // kLanes bytes -> kLanes floats in the same order, each the value times 2^-8, through FP16 (as
  // vec_avx512f.h).
  static T fp8_pairs(const uint8_t* p) {
    const __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(short(0xbf80))));
  }
  // 2 kLanes bytes (kLanes columns x k even, odd) -> the two rows, exact (as vec_avx512f.h).
  static void fp8_rows(const uint8_t* p, T& even, T& odd) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i mask = _mm256_set1_epi32(int(0x87f00000u));
    const T two120 = _mm256_set1_ps(0x1p120f);
    const __m256i e = _mm256_and_si256(_mm256_slli_epi32(w, 20), mask);  // low word's byte
    const __m256i o = _mm256_and_si256(_mm256_slli_epi32(w, 4), mask);   // high word's
    even = _mm256_mul_ps(_mm256_castsi256_ps(e), two120);
    odd = _mm256_mul_ps(_mm256_castsi256_ps(o), two120);
  }
  // The same for 2 kLanes BF16 values: each 32-bit pair holds k even low, k odd high.
  static void bf16_rows(const uint16_t* p, T& even, T& odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
  }

  // Doubles: lanes [0, kLanes / 2) or [kLanes / 2, kLanes) of v, widened (exact).
  static D lo_f64(T v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
  static D hi_f64(T v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
  static D dzero() { return _mm256_setzero_pd(); }
  static D dfmadd(D a, D b, D c) { return _mm256_fmadd_pd(a, b, c); }
  static void dstoreu(double* p, D v) { _mm256_storeu_pd(p, v); }

  // mla_decode's softmax.
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
  // v in lanes with lim > t, -inf elsewhere (lim aligned).
  static T visible(const int32_t* lim, int64_t t, T v) {
    const __m256i k = _mm256_cmpgt_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(lim)),
                                         _mm256_set1_epi32(int(t)));
    return _mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()), v, _mm256_castsi256_ps(k));
  }
  static T zero_where_ninf(T m) {  // 0 in lanes where m = -inf
    const T k = _mm256_cmp_ps(m, _mm256_set1_ps(-__builtin_inff()), _CMP_EQ_OQ);
    return _mm256_andnot_ps(k, m);
  }

 private:
  static __m256i first(int64_t n) {  // the mask of maskload/maskstore
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n < 8 ? n : 8)), lane);
  }
  // 8 values in the low 128 bits.
  static __m128i to_bf16(T v) {
    const __m256i u = _mm256_castps_si256(v);
    // |u| > 0x7f800000 as signed compare: both sides are non-negative 31-bit values.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i w = _mm256_blendv_epi8(r, quiet, nan);  // 16-bit values in 32-bit lanes
    const __m256i packed = _mm256_packus_epi32(w, w);     // per 128-bit half: 4 values, twice
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));  // halves' lows
  }
};
