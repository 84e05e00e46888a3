// AVX-512 BF16 (vdpbf16ps) kernel for gemm_bf16. Runs only when cpu_isa() >= kAvx512Bf16.
#include <immintrin.h>

#include <algorithm>

#include <cstdint>

namespace moeserve {

namespace {

// Horizontal sum through memory (GCC 12's extract/reduce intrinsics trip -Wuninitialized).
float hsum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0.0f;
  for (float x : t) s += x;
  return s;
}

// Dot products of up to 4 rows of x with one row of w, 32 k at a time; tail masked.
template <int R>
void dot_rows(const uint16_t* x, int64_t ldx, const uint16_t* wr, int64_t k, float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= k; c += 32) {
    __m512bh wv = (__m512bh)_mm512_loadu_si512(wr + c);
    for (int r = 0; r < R; ++r) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * ldx + c);
      acc[r] = _mm512_dpbf16_ps(acc[r], xv, wv);
    }
  }
  if (c < k) {
    __mmask32 mask = (__mmask32)((1ull << (k - c)) - 1);
    __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, wr + c);
    for (int r = 0; r < R; ++r) {
      __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + r * ldx + c);
      acc[r] = _mm512_dpbf16_ps(acc[r], xv, wv);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

template <int R>
void dot_rows_f32(const float* x, int64_t ldx, const float* wr, int64_t k, float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= k; c += 16) {
    __m512 wv = _mm512_loadu_ps(wr + c);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * ldx + c), wv, acc[r]);
  }
  if (c < k) {
    __mmask16 mask = (__mmask16)((1u << (k - c)) - 1);
    __m512 wv = _mm512_maskz_loadu_ps(mask, wr + c);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + r * ldx + c), wv, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

}  // namespace

void gemm_f32_avx512_rows(const float* x, int64_t m, int64_t ldx, const float* w, int64_t n0,
                          int64_t n1, int64_t k, int64_t ldw, float* y, int64_t ldy) {
  float out[4];
  for (int64_t j = n0; j < n1; ++j) {
    const float* wr = w + j * ldw;
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
      dot_rows_f32<4>(x + i * ldx, ldx, wr, k, out);
      for (int r = 0; r < 4; ++r) y[(i + r) * ldy + j] = out[r];
    }
    for (; i < m; ++i) {
      dot_rows_f32<1>(x + i * ldx, ldx, wr, k, out);
      y[i * ldy + j] = out[0];
    }
  }
}

void gemm_f32_kn_avx512_cols(const float* x, int64_t m, int64_t ldx, const float* wt, int64_t j0,
                             int64_t j1, int64_t k, int64_t ldwt, float* y, int64_t ldy) {
  for (int64_t j = j0; j < j1; j += 64) {
    // Up to 4 zmm of output columns; the last may be partial (masked).
    const int64_t width = std::min<int64_t>(64, j1 - j);
    const int nv = int((width + 15) / 16);
    __mmask16 mask[4];
    for (int v = 0; v < 4; ++v) {
      int64_t lanes = std::clamp<int64_t>(width - 16 * v, 0, 16);
      mask[v] = (__mmask16)((1u << lanes) - 1);
    }
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
      __m512 acc[4][4];
      for (int r = 0; r < 4; ++r)
        for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
      for (int64_t c = 0; c < k; ++c) {
        __m512 w[4];
        for (int v = 0; v < nv; ++v) w[v] = _mm512_maskz_loadu_ps(mask[v], wt + c * ldwt + j + 16 * v);
        for (int r = 0; r < 4; ++r) {
          __m512 xb = _mm512_set1_ps(x[(i + r) * ldx + c]);
          for (int v = 0; v < nv; ++v) acc[r][v] = _mm512_fmadd_ps(xb, w[v], acc[r][v]);
        }
      }
      for (int r = 0; r < 4; ++r)
        for (int v = 0; v < nv; ++v) _mm512_mask_storeu_ps(y + (i + r) * ldy + j + 16 * v, mask[v], acc[r][v]);
    }
    for (; i < m; ++i) {
      __m512 acc[4];
      for (int v = 0; v < 4; ++v) acc[v] = _mm512_setzero_ps();
      for (int64_t c = 0; c < k; ++c) {
        __m512 xb = _mm512_set1_ps(x[i * ldx + c]);
        for (int v = 0; v < nv; ++v) {
          acc[v] = _mm512_fmadd_ps(xb, _mm512_maskz_loadu_ps(mask[v], wt + c * ldwt + j + 16 * v), acc[v]);
        }
      }
      for (int v = 0; v < nv; ++v) _mm512_mask_storeu_ps(y + i * ldy + j + 16 * v, mask[v], acc[v]);
    }
  }
}

void gemm_bf16_avx512_rows(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* w,
                           int64_t n0, int64_t n1, int64_t k, int64_t ldw, float* y, int64_t ldy) {
  float out[4];
  for (int64_t j = n0; j < n1; ++j) {
    const uint16_t* wr = w + j * ldw;
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
      dot_rows<4>(x + i * ldx, ldx, wr, k, out);
      for (int r = 0; r < 4; ++r) y[(i + r) * ldy + j] = out[r];
    }
    for (; i < m; ++i) {
      dot_rows<1>(x + i * ldx, ldx, wr, k, out);
      y[i * ldy + j] = out[0];
    }
  }
}

}  // namespace moeserve
