// Rotary position embedding on interleaved pairs (x[2i], x[2i+1]) rotated by pos * inv_freq[i],
// as DeepSeek's model.py (view_as_complex) does; with optional YaRN frequency blending and
// attention factor (Hugging Face's _compute_yarn_parameters semantics).
//
// RopeTable is immutable after construction and may be shared between threads.
//
// apply() is the reference path's kernel; apply_fast() is the fast path's: the same cos/sin
// (std::cos/std::sin of the same F32 angle, times the attention factor) and the same rounded
// products and sums, vectorized over the pairs, so every ISA level gives apply()'s bits.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu_features.h"

namespace moeserve {

struct RopeParams {
  int64_t dim = 0;  // rotary dims (even)
  double theta = 10000.0;
  // YaRN (all unused when yarn == false).
  bool yarn = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

class RopeTable {
 public:
  explicit RopeTable(const RopeParams& p);

  int64_t dim() const { return dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float attention_factor() const { return attention_factor_; }

  // Rotates n_rows vectors of dim values (row stride ld) in place, all at position pos.
  void apply(float* x, int64_t n_rows, int64_t ld, int64_t pos) const;
  // apply() with the same bits, the pairs rotated 8 or 16 values at a time (the scalar level,
  // and rotary dims above 512, run apply()).
  void apply_fast(float* x, int64_t n_rows, int64_t ld, int64_t pos, Isa isa = active_isa()) const;

 private:
  int64_t dim_;
  std::vector<float> inv_freq_;  // [dim / 2]
  float attention_factor_ = 1.0f;
};

namespace rope_detail {
// x[r * ld + i] for i in [0, dim): out[i] = x[i] * cos2[i] + x[i ^ 1] * sin2[i], the products
// rounded before the add (cos2 = (c, c) and sin2 = (-s, s) per pair).
void rotate_avx512(const float* cos2, const float* sin2, int64_t dim, float* x, int64_t n_rows,
                   int64_t ld);
void rotate_avx2(const float* cos2, const float* sin2, int64_t dim, float* x, int64_t n_rows,
                 int64_t ld);
}  // namespace rope_detail

}  // namespace moeserve
