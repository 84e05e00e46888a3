#include "model/dsa_indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/dtype.h"

namespace moeserve {

void hadamard_rotate(float* x, int64_t n) {
  CHECK(n > 0 && (n & (n - 1)) == 0, "a Hadamard rotation of a power of two");
  for (int64_t h = 1; h < n; h *= 2) {  // butterflies: [a + b, a - b]
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(float(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

float quantize_index_fp8(const float* x, uint8_t* q) {
  float amax = 1e-4f;
  for (int64_t i = 0; i < kIndexKeyDim; ++i) amax = std::max(amax, std::fabs(x[i]));
  // 2^ceil(log2(amax / 448)), exactly: frexp gives amax / 448 = m * 2^e with m in [0.5, 1).
  int e = 0;
  const float m = std::frexp(amax / 448.0f, &e);
  const float s = std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
  for (int64_t i = 0; i < kIndexKeyDim; ++i) q[i] = f32_to_fp8e4m3(x[i] / s);
  return s;
}

void rope_half(float* x, int64_t dim, std::span<const float> inv_freq, float attention_factor,
               int64_t pos) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float angle = float(pos) * inv_freq[size_t(i)];
    const float c = std::cos(angle) * attention_factor, s = std::sin(angle) * attention_factor;
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = a * s + b * c;
  }
}

void layer_norm(float* x, int64_t n, const float* w, const float* b, float eps) {
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= double(n);
  double var = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= double(n);
  const float inv = float(1.0 / std::sqrt(var + double(eps)));
  for (int64_t i = 0; i < n; ++i) x[i] = (float(x[i] - mean) * inv) * w[i] + b[i];
}

float index_score_f32(const float* q, const float* w, int64_t n_heads, const float* key,
                      float scale) {
  float sum = 0;
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* qh = q + h * kIndexKeyDim;
    float dot = 0;
    for (int64_t d = 0; d < kIndexKeyDim; ++d) dot += qh[d] * key[d];
    sum += w[h] * std::max(dot * scale, 0.0f);
  }
  return sum;
}

}  // namespace moeserve
