// attend_f32, AVX-512F level (kernels/attend_f32.h). Compiled with -mavx512{f,bw,vl,dq} -mfma;
// runs only when cpu_isa() says so.
#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "kernels/attend_f32.h"

namespace moeserve::attend_f32_detail {
namespace {

// The first `rest` (< 16) lanes, or all 16.
__mmask16 lanes(int64_t rest) {
  return rest >= 16 ? __mmask16(0xffff) : __mmask16((1u << rest) - 1);
}

}  // namespace

void dot_rows_avx512(const float* q, const float* rows, int64_t n, int64_t d, int64_t ld,
                     float* out) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {  // four rows share each load of q
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float* r = rows + j * ld;
    for (int64_t k = 0; k < d; k += 16) {
      const __mmask16 m = lanes(d - k);
      const __m512 qv = _mm512_maskz_loadu_ps(m, q + k);
      a0 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, r + k), a0);
      a1 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, r + ld + k), a1);
      a2 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, r + 2 * ld + k), a2);
      a3 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, r + 3 * ld + k), a3);
    }
    out[j] = _mm512_reduce_add_ps(a0);
    out[j + 1] = _mm512_reduce_add_ps(a1);
    out[j + 2] = _mm512_reduce_add_ps(a2);
    out[j + 3] = _mm512_reduce_add_ps(a3);
  }
  for (; j < n; ++j) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t k = 0; k < d; k += 16) {
      const __mmask16 m = lanes(d - k);
      a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + k),
                          _mm512_maskz_loadu_ps(m, rows + j * ld + k), a);
    }
    out[j] = _mm512_reduce_add_ps(a);
  }
}

void axpy_rows_avx512(const float* p, const float* rows, int64_t n, int64_t d, int64_t ld,
                      float* out) {
  for (int64_t k = 0; k < d; k += 64) {  // 64 outputs in registers over all the rows
    __m512 o[4];
    __mmask16 m[4];
    for (int c = 0; c < 4; ++c) {
      m[c] = k + 16 * c < d ? lanes(d - k - 16 * c) : __mmask16(0);
      o[c] = _mm512_maskz_loadu_ps(m[c], out + k + 16 * c);
    }
    for (int64_t j = 0; j < n; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const float* r = rows + j * ld + k;
      for (int c = 0; c < 4; ++c) {
        o[c] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(m[c], r + 16 * c), o[c]);
      }
    }
    for (int c = 0; c < 4; ++c) _mm512_mask_storeu_ps(out + k + 16 * c, m[c], o[c]);
  }
}

namespace {

// kRows rows against G groups of 16 heads: per value k of the rows, G loads of the queries'
// values (qt [d][heads]) and one broadcast per row feed G * kRows FMAs.
template <int G, int kRows>
void relu_rows(const float* qt, const float* w, int64_t heads, int64_t h0, const float* const* r,
               int64_t d, __m512* tot) {
  __m512 a[kRows][G];
  for (int i = 0; i < kRows; ++i) {
    for (int g = 0; g < G; ++g) a[i][g] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < d; ++k) {
    __m512 qv[G];
    for (int g = 0; g < G; ++g) qv[g] = _mm512_loadu_ps(qt + k * heads + h0 + 16 * g);
    for (int i = 0; i < kRows; ++i) {
      const __m512 x = _mm512_set1_ps(r[i][k]);
      for (int g = 0; g < G; ++g) a[i][g] = _mm512_fmadd_ps(qv[g], x, a[i][g]);
    }
  }
  for (int g = 0; g < G; ++g) {
    const __m512 wv = _mm512_loadu_ps(w + h0 + 16 * g);
    for (int i = 0; i < kRows; ++i) {
      tot[i] = _mm512_fmadd_ps(wv, _mm512_max_ps(a[i][g], _mm512_setzero_ps()), tot[i]);
    }
  }
}

}  // namespace

void relu_scores_avx512(const float* qt, const float* w, int64_t heads, const float* rows,
                        int64_t n, int64_t d, int64_t ld, float* out) {
  auto block = [&]<int R>(int64_t j) {
    const float* r[R];
    for (int i = 0; i < R; ++i) r[i] = rows + (j + i) * ld;
    __m512 tot[R];
    for (int i = 0; i < R; ++i) tot[i] = _mm512_setzero_ps();
    int64_t h0 = 0;
    for (; h0 + 64 <= heads; h0 += 64) relu_rows<4, R>(qt, w, heads, h0, r, d, tot);
    for (; h0 < heads; h0 += 16) relu_rows<1, R>(qt, w, heads, h0, r, d, tot);
    for (int i = 0; i < R; ++i) out[j + i] = _mm512_reduce_add_ps(tot[i]);
  };
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) block.template operator()<4>(j);  // 16 accumulators, 4 queries
  for (; j < n; ++j) block.template operator()<1>(j);
}

}  // namespace moeserve::attend_f32_detail
