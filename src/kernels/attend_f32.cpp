#include "kernels/attend_f32.h"

#include <algorithm>
#include <vector>

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

void relu_scores_f32(const float* q, const float* w, int64_t heads, const float* rows, int64_t n,
                     int64_t d, int64_t ld, float* out, Isa isa) {
  if (avx512(isa) && heads % 16 == 0) {
    return attend_f32_detail::relu_scores_avx512(q, w, heads, rows, n, d, ld, out);
  }
  std::vector<float> dots(static_cast<size_t>(n));
  std::fill(out, out + n, 0.0f);
  for (int64_t h = 0; h < heads; ++h) {
    dot_rows_f32(q + h * d, rows, n, d, ld, dots.data(), isa);
    for (int64_t j = 0; j < n; ++j) out[j] += w[h] * std::max(dots[size_t(j)], 0.0f);
  }
}

}  // namespace moeserve
