#include "kernels/attend_f32.h"

#include <algorithm>

namespace moeserve {

namespace {

bool avx512(Isa isa) {
  return isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16 || isa == Isa::kAmx;
}

}  // namespace

void dot_rows_f32(const float* q, const float* rows, int64_t n, int64_t d, int64_t ld, float* out,
                  Isa isa) {
  if (avx512(isa)) return attend_f32_detail::dot_rows_avx512(q, rows, n, d, ld, out);
  for (int64_t j = 0; j < n; ++j) {
    const float* r = rows + j * ld;
    float s = 0;
    for (int64_t k = 0; k < d; ++k) s += q[k] * r[k];
    out[j] = s;
  }
}

void axpy_rows_f32(const float* p, const float* rows, int64_t n, int64_t d, int64_t ld, float* out,
                   Isa isa) {
  if (avx512(isa)) return attend_f32_detail::axpy_rows_avx512(p, rows, n, d, ld, out);
  for (int64_t j = 0; j < n; ++j) {
    const float* r = rows + j * ld;
    for (int64_t k = 0; k < d; ++k) out[k] += p[j] * r[k];
  }
}

void relu_scores_transpose(const float* q, int64_t heads, int64_t d, float* qt) {
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t k = 0; k < d; ++k) qt[k * heads + h] = q[h * d + k];
  }
}

void relu_scores_f32(const float* qt, const float* w, int64_t heads, const float* rows, int64_t n,
                     int64_t d, int64_t ld, float* out, Isa isa) {
  if (avx512(isa) && heads % 16 == 0) {
    return attend_f32_detail::relu_scores_avx512(qt, w, heads, rows, n, d, ld, out);
  }
  for (int64_t j = 0; j < n; ++j) {
    const float* r = rows + j * ld;
    float sum = 0;
    for (int64_t h = 0; h < heads; ++h) {
      float dot = 0;
      for (int64_t k = 0; k < d; ++k) dot += qt[k * heads + h] * r[k];
      sum += w[h] * std::max(dot, 0.0f);
    }
    out[j] = sum;
  }
}

}  // namespace moeserve
