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

void relu_scores_avx512(const float* q, const float* w, int64_t heads, const float* rows, int64_t n,
                        int64_t d, int64_t ld, float* out) {
  // q transposed to [d][heads] once, so each of a row's values multiplies 16 heads at a time.
  thread_local std::vector<float> qt;
  qt.resize(size_t(d * heads));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t k = 0; k < d; ++k) qt[size_t(k * heads + h)] = q[h * d + k];
  }
  const int64_t groups = heads / 16;
  for (int64_t j = 0; j < n; j += 4) {
    const int rn = n - j < 4 ? int(n - j) : 4;
    const float* r[4];
    for (int i = 0; i < 4; ++i) r[i] = rows + (j + (i < rn ? i : 0)) * ld;
    __m512 tot[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (int64_t g = 0; g < groups; ++g) {
      __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
      const float* qg = qt.data() + 16 * g;
      for (int64_t k = 0; k < d; ++k) {
        const __m512 qv = _mm512_loadu_ps(qg + k * heads);
        for (int i = 0; i < 4; ++i) a[i] = _mm512_fmadd_ps(qv, _mm512_set1_ps(r[i][k]), a[i]);
      }
      const __m512 wv = _mm512_loadu_ps(w + 16 * g);
      for (int i = 0; i < 4; ++i) {
        tot[i] = _mm512_fmadd_ps(wv, _mm512_max_ps(a[i], _mm512_setzero_ps()), tot[i]);
      }
    }
    for (int i = 0; i < rn; ++i) out[j + i] = _mm512_reduce_add_ps(tot[i]);
  }
}

}  // namespace moeserve::attend_f32_detail
