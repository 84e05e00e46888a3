#include "kernels/gemm_bf16.h"

#include "kernels/convert.h"

#include <algorithm>

#include "core/dtype.h"

namespace moeserve {

// Implemented in gemm_bf16_avx512.cpp (rows [n0, n1) of W).
void gemm_bf16_avx512_rows(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n0,
                           int64_t n1, int64_t k, int64_t ldw, float* y, int64_t ldy);

// Implemented in gemm_bf16_avx512.cpp (AVX-512F with BW and VL).
void gemm_f32_avx512_rows(const float* x, int64_t m, int64_t ldx, const float* w, int64_t n0,
                          int64_t n1, int64_t k, int64_t ldw, float* y, int64_t ldy);
void gemm_f32_bf16w_avx512_rows(const float* x, int64_t m, int64_t ldx, const uint16_t* w,
                                int64_t n0, int64_t n1, int64_t k, int64_t ldw, float* y,
                                int64_t ldy);

namespace {

float weight_f32(float w) {
  return w;
}
float weight_f32(uint16_t w) {
  return bf16_to_f32(w);
}
void avx512_rows(const float* x, int64_t m, int64_t ldx, const float* w, int64_t n0, int64_t n1,
                 int64_t k, int64_t ldw, float* y, int64_t ldy) {
  gemm_f32_avx512_rows(x, m, ldx, w, n0, n1, k, ldw, y, ldy);
}
void avx512_rows(const float* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n0, int64_t n1,
                 int64_t k, int64_t ldw, float* y, int64_t ldy) {
  gemm_f32_bf16w_avx512_rows(x, m, ldx, w, n0, n1, k, ldw, y, ldy);
}

template <typename W>
void f32_gemm(const float* x, int64_t m, int64_t ldx, const W* w, int64_t n, int64_t k, int64_t ldw,
              float* y, int64_t ldy, ThreadPool* pool, Isa isa) {
  if (m <= 0 || n <= 0) return;
  auto rows = [&](int64_t n0, int64_t n1) {
    if (isa_at_most(Isa::kAvx512, isa)) {
      avx512_rows(x, m, ldx, w, n0, n1, k, ldw, y, ldy);
      return;
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = n0; j < n1; ++j) {
        float acc = 0.0f;
        for (int64_t c = 0; c < k; ++c) acc += x[i * ldx + c] * weight_f32(w[j * ldw + c]);
        y[i * ldy + j] = acc;
      }
    }
  };
  if (!pool) {
    rows(0, n);
  } else if (n >= 64 * int64_t(pool->size()) || m < 8) {
    // Outputs in shares of at least 16: a decode step's router (64-256 experts of one row, a
    // 7168-wide row each on V3) is spread over up to 16 threads, not one per 64 experts.
    pool->parallel_for(n, rows, 16);
  } else {
    // Few outputs per row and many rows (the MoE router: [tokens, 64..256 experts]): the
    // threads take rows of X instead. Each output is the same dot product either way.
    pool->parallel_for(
        m,
        [&](int64_t i0, int64_t i1) {
          f32_gemm(x + i0 * ldx, i1 - i0, ldx, w, n, k, ldw, y + i0 * ldy, ldy, nullptr, isa);
        },
        4);
  }
}

}  // namespace

void gemm_f32(const float* x, int64_t m, int64_t ldx, const float* w, int64_t n, int64_t k,
              int64_t ldw, float* y, int64_t ldy, ThreadPool* pool, Isa isa) {
  f32_gemm(x, m, ldx, w, n, k, ldw, y, ldy, pool, isa);
}

void gemm_f32_bf16w(const float* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n, int64_t k,
                    int64_t ldw, float* y, int64_t ldy, ThreadPool* pool, Isa isa) {
  f32_gemm(x, m, ldx, w, n, k, ldw, y, ldy, pool, isa);
}

// Implemented in gemm_bf16_avx512.cpp (AVX-512F only): output columns [j0, j1).
void gemm_f32_kn_avx512_cols(const float* x, int64_t m, int64_t ldx, const float* wt, int64_t j0,
                             int64_t j1, int64_t k, int64_t ldwt, float* y, int64_t ldy);

void gemm_f32_kn(const float* x, int64_t m, int64_t ldx, const float* wt, int64_t n, int64_t k,
                 int64_t ldwt, float* y, int64_t ldy, ThreadPool* pool, Isa isa) {
  if (m <= 0 || n <= 0) return;
  auto cols = [&](int64_t j0, int64_t j1) {
    if (isa_at_most(Isa::kAvx512, isa)) {
      gemm_f32_kn_avx512_cols(x, m, ldx, wt, j0, j1, k, ldwt, y, ldy);
      return;
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = j0; j < j1; ++j) {
        float acc = 0.0f;
        for (int64_t c = 0; c < k; ++c) acc += x[i * ldx + c] * wt[c * ldwt + j];
        y[i * ldy + j] = acc;
      }
    }
  };
  // Column chunks of 64 (one 4-zmm tile) per task.
  const int64_t tiles = (n + 63) / 64;
  auto tile_range = [&](int64_t t0, int64_t t1) { cols(t0 * 64, std::min(n, t1 * 64)); };
  if (pool && tiles > 1) {
    pool->parallel_for(tiles, tile_range);
  } else {
    cols(0, n);
  }
}

void gemm_bf16_ref(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n,
                   int64_t k, int64_t ldw, float* y, int64_t ldy) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t c = 0; c < k; ++c)
        acc += bf16_to_f32(x[i * ldx + c]) * bf16_to_f32(w[j * ldw + c]);
      y[i * ldy + j] = acc;
    }
  }
}

void gemm_bf16(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n, int64_t k,
               int64_t ldw, float* y, int64_t ldy, ThreadPool* pool, Isa isa) {
  if (m <= 0 || n <= 0) return;
  auto rows = [&](int64_t n0, int64_t n1) {
    if (isa >= Isa::kAvx512Bf16) {
      gemm_bf16_avx512_rows(x, m, ldx, w, n0, n1, k, ldw, y, ldy);
    } else {
      gemm_bf16_ref(x, m, ldx, w + n0 * ldw, n1 - n0, k, ldw, y + n0, ldy);
    }
  };
  if (pool) {
    pool->parallel_for(n, rows, 64);
  } else {
    rows(0, n);
  }
}

void f32_to_bf16_row(const float* x, int64_t n, uint16_t* out) {
  f32_to_bf16_row_isa(x, n, out);
}

}  // namespace moeserve
