#include "kernels/rope.h"

#include <algorithm>
#include <cmath>

namespace moeserve {

namespace {

double yarn_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// Dimension index whose wavelength completes `rotations` turns over max_pos positions.
double correction_dim(double rotations, double dim, double base, double max_pos) {
  return dim * std::log(max_pos / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
}

}  // namespace

RopeTable::RopeTable(const RopeParams& p) : dim_(p.dim) {
  const int64_t half = p.dim / 2;
  inv_freq_.resize(half);
  // In float32 like the references: base ** (2i / dim).
  for (int64_t i = 0; i < half; ++i) {
    float exponent = float(2 * i) / float(p.dim);
    inv_freq_[i] = 1.0f / std::pow(float(p.theta), exponent);
  }
  if (!p.yarn) return;
  double orig = double(p.original_max_position_embeddings);
  double low = std::floor(correction_dim(p.beta_fast, double(p.dim), p.theta, orig));
  double high = std::ceil(correction_dim(p.beta_slow, double(p.dim), p.theta, orig));
  low = std::max(low, 0.0);
  high = std::min(high, double(p.dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    float ramp = float(std::clamp((double(i) - low) / (high - low), 0.0, 1.0));
    float extrapolation = 1.0f - ramp;  // weight of the original frequency
    float interp = inv_freq_[i] / float(p.factor);
    inv_freq_[i] = interp * (1.0f - extrapolation) + inv_freq_[i] * extrapolation;
  }
  if (p.mscale != 0.0 && p.mscale_all_dim != 0.0) {
    attention_factor_ =
        float(yarn_mscale(p.factor, p.mscale) / yarn_mscale(p.factor, p.mscale_all_dim));
  } else {
    attention_factor_ = float(yarn_mscale(p.factor, 1.0));
  }
}

void RopeTable::apply(float* x, int64_t n_rows, int64_t ld, int64_t pos) const {
  const int64_t half = dim_ / 2;
  for (int64_t i = 0; i < half; ++i) {
    float angle = float(pos) * inv_freq_[i];
    float c = std::cos(angle) * attention_factor_;
    float s = std::sin(angle) * attention_factor_;
    for (int64_t r = 0; r < n_rows; ++r) {
      float* v = x + r * ld + 2 * i;
      float a = v[0], b = v[1];
      v[0] = a * c - b * s;
      v[1] = a * s + b * c;
    }
  }
}

void RopeTable::apply_fast(float* x, int64_t n_rows, int64_t ld, int64_t pos, Isa isa) const {
  constexpr int64_t kMaxDim = 512;  // the stack tables below (DeepSeek uses 64)
  if (isa == Isa::kScalar || dim_ > kMaxDim) return apply(x, n_rows, ld, pos);
  alignas(64) float cos2[kMaxDim], sin2[kMaxDim];  // [dim]: (c, c) and (-s, s) per pair
  for (int64_t i = 0; i < dim_ / 2; ++i) {         // apply()'s c and s
    float angle = float(pos) * inv_freq_[i];
    float c = std::cos(angle) * attention_factor_;
    float s = std::sin(angle) * attention_factor_;
    cos2[2 * i] = cos2[2 * i + 1] = c;
    sin2[2 * i] = -s;
    sin2[2 * i + 1] = s;
  }
  const int64_t pairs_dim = dim_ / 2 * 2;  // an odd last value stays as it is, as in apply()
  if (isa == Isa::kAvx2) return rope_detail::rotate_avx2(cos2, sin2, pairs_dim, x, n_rows, ld);
  rope_detail::rotate_avx512(cos2, sin2, pairs_dim, x, n_rows, ld);
}

}  // namespace moeserve
