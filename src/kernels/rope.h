// Rotary position embedding on interleaved pairs (x[2i], x[2i+1]) rotated by pos * inv_freq[i],
// as DeepSeek's model.py (view_as_complex) does; with optional YaRN frequency blending and
// attention factor (Hugging Face's _compute_yarn_parameters semantics).
//
// RopeTable is immutable after construction and may be shared between threads.
#pragma once

#include <cstdint>
#include <vector>

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

 private:
  int64_t dim_;
  std::vector<float> inv_freq_;  // [dim / 2]
  float attention_factor_ = 1.0f;
};

}  // namespace moeserve
