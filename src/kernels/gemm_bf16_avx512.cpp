// AVX-512 BF16 (vdpbf16ps) kernel for gemm_bf16. Runs only when cpu_isa() >= kAvx512Bf16.
#include <immintrin.h>

#include <algorithm>

#include <cstdint>

namespace moeserve {

namespace {

// Horizontal sum as a tree of four shuffle-and-add steps (256-bit halves, 128-bit quarters,
// pairs, neighbours); every lane ends with the total. A dot product's reduction depends only on
// its own accumulator, so results stay independent of the blocking.
// (The zero-masked forms with a full mask: GCC 12's unmasked shuffles read an "undefined"
// vector that trips -Wuninitialized, GCC bug 105593.)
float hsum(__m512 v) {
  const __mmask16 all = 0xffff;
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(all, v, v, 0x4e));
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(all, v, v, 0xb1));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(all, v, 0x4e));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(all, v, 0xb1));
  return _mm512_cvtss_f32(v);
}

// 16 weights as F32: loaded, or BF16 widened (exact); `mask` for a tail.
inline __m512 load_w(const float* w, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, w);
}
inline __m512 load_w(const uint16_t* w, __mmask16 mask) {
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

template <int R, typename W>
void dot_rows_f32(const float* x, int64_t ldx, const W* wr, int64_t k, float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= k; c += 16) {
    __m512 wv = load_w(wr + c, 0xffff);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * ldx + c), wv, acc[r]);
  }
  if (c < k) {
    __mmask16 mask = (__mmask16)((1u << (k - c)) - 1);
    __m512 wv = load_w(wr + c, mask);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + r * ldx + c), wv, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

template <typename W>
void f32_rows(const float* x, int64_t m, int64_t ldx, const W* w, int64_t n0, int64_t n1, int64_t k,
              int64_t ldw, float* y, int64_t ldy) {
  // Blocks of X's rows of ~256 KB (stay in L2 while every W row passes over them; a multiple of
  // 4 rows). Each output is one row's dot product whatever the blocking: the same bits.
  const int64_t mb =
      std::max<int64_t>(4, (int64_t(256) << 10) / (4 * std::max<int64_t>(k, 1)) / 4 * 4);
  float out[4];
  for (int64_t i0 = 0; i0 < m; i0 += mb) {
    const int64_t i1 = std::min(m, i0 + mb);
    for (int64_t j = n0; j < n1; ++j) {
      const W* wr = w + j * ldw;
      int64_t i = i0;
      for (; i + 4 <= i1; i += 4) {
        dot_rows_f32<4>(x + i * ldx, ldx, wr, k, out);
        for (int r = 0; r < 4; ++r) y[(i + r) * ldy + j] = out[r];
      }
      for (; i < i1; ++i) {
        dot_rows_f32<1>(x + i * ldx, ldx, wr, k, out);
        y[i * ldy + j] = out[0];
      }
    }
  }
}

}  // namespace

void gemm_f32_avx512_rows(const float* x, int64_t m, int64_t ldx, const float* w, int64_t n0,
                          int64_t n1, int64_t k, int64_t ldw, float* y, int64_t ldy) {
  f32_rows(x, m, ldx, w, n0, n1, k, ldw, y, ldy);
}

void gemm_f32_bf16w_avx512_rows(const float* x, int64_t m, int64_t ldx, const uint16_t* w,
                                int64_t n0, int64_t n1, int64_t k, int64_t ldw, float* y,
                                int64_t ldy) {
  f32_rows(x, m, ldx, w, n0, n1, k, ldw, y, ldy);
}

namespace {

// Rows [i, i + R) of y, columns [j, j + 64): R x 4 accumulators in registers (compile-time
// extents, so nothing spills), one broadcast per row and four weight loads per k step.
template <int R>
inline void f32_kn_tile64(const float* x, int64_t ldx, const float* wt, int64_t ldwt, int64_t k,
                          float* y, int64_t ldy) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t c = 0; c < k; ++c) {
    const float* wr = wt + c * ldwt;
    const __m512 w0 = _mm512_loadu_ps(wr), w1 = _mm512_loadu_ps(wr + 16);
    const __m512 w2 = _mm512_loadu_ps(wr + 32), w3 = _mm512_loadu_ps(wr + 48);
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * ldx + c]);
      acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(xb, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(xb, w3, acc[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm512_storeu_ps(y + r * ldy + 16 * v, acc[r][v]);
}

}  // namespace

void gemm_f32_kn_avx512_cols(const float* x, int64_t m, int64_t ldx, const float* wt, int64_t j0,
                             int64_t j1, int64_t k, int64_t ldwt, float* y, int64_t ldy) {
  // Whole 64-column blocks: 6 rows at a time (24 accumulators), then the rest.
  int64_t j = j0;
  for (; j + 64 <= j1; j += 64) {
    int64_t i = 0;
    for (; i + 6 <= m; i += 6)
      f32_kn_tile64<6>(x + i * ldx, ldx, wt + j, ldwt, k, y + i * ldy + j, ldy);
    for (; i + 2 <= m; i += 2)
      f32_kn_tile64<2>(x + i * ldx, ldx, wt + j, ldwt, k, y + i * ldy + j, ldy);
    for (; i < m; ++i) f32_kn_tile64<1>(x + i * ldx, ldx, wt + j, ldwt, k, y + i * ldy + j, ldy);
  }
  // A partial block of columns: masked.
  for (; j < j1; j += 64) {
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
        for (int v = 0; v < nv; ++v)
          w[v] = _mm512_maskz_loadu_ps(mask[v], wt + c * ldwt + j + 16 * v);
        for (int r = 0; r < 4; ++r) {
          __m512 xb = _mm512_set1_ps(x[(i + r) * ldx + c]);
          for (int v = 0; v < nv; ++v) acc[r][v] = _mm512_fmadd_ps(xb, w[v], acc[r][v]);
        }
      }
      for (int r = 0; r < 4; ++r)
        for (int v = 0; v < nv; ++v)
          _mm512_mask_storeu_ps(y + (i + r) * ldy + j + 16 * v, mask[v], acc[r][v]);
    }
    for (; i < m; ++i) {
      __m512 acc[4];
      for (int v = 0; v < 4; ++v) acc[v] = _mm512_setzero_ps();
      for (int64_t c = 0; c < k; ++c) {
        __m512 xb = _mm512_set1_ps(x[i * ldx + c]);
        for (int v = 0; v < nv; ++v) {
          acc[v] = _mm512_fmadd_ps(xb, _mm512_maskz_loadu_ps(mask[v], wt + c * ldwt + j + 16 * v),
                                   acc[v]);
        }
      }
      for (int v = 0; v < nv; ++v) _mm512_mask_storeu_ps(y + i * ldy + j + 16 * v, mask[v], acc[v]);
    }
  }
}

namespace {

// R rows of x against C rows of w: R x C dot products sharing every load (k in steps of 32).
template <int R, int C>
void dot_block(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t k, float* y,
               int64_t ldy) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    __m512bh wv[C];
    for (int c = 0; c < C; ++c) wv[c] = (__m512bh)_mm512_loadu_si512(w + c * ldw + i);
    for (int r = 0; r < R; ++r) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * ldx + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  if (i < k) {
    __mmask32 mask = (__mmask32)((1ull << (k - i)) - 1);
    __m512bh wv[C];
    for (int c = 0; c < C; ++c) wv[c] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + c * ldw + i);
    for (int r = 0; r < R; ++r) {
      __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + r * ldx + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = hsum(acc[r][c]);
}

template <int C>
void rows_of_x(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t k,
               float* y, int64_t ldy) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) dot_block<4, C>(x + i * ldx, ldx, w, ldw, k, y + i * ldy, ldy);
  for (; i < m; ++i) dot_block<1, C>(x + i * ldx, ldx, w, ldw, k, y + i * ldy, ldy);
}

}  // namespace

void gemm_bf16_avx512_rows(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n0,
                           int64_t n1, int64_t k, int64_t ldw, float* y, int64_t ldy) {
  // 4 rows of w at a time: each x load feeds 4 dot products, each w load up to 4.
  int64_t j = n0;
  for (; j + 4 <= n1; j += 4) rows_of_x<4>(x, m, ldx, w + j * ldw, ldw, k, y + j, ldy);
  for (; j < n1; ++j) rows_of_x<1>(x, m, ldx, w + j * ldw, ldw, k, y + j, ldy);
}

}  // namespace moeserve
