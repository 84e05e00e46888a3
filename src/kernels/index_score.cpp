#include "kernels/index_score.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"

namespace moeserve {

float index_score(const uint8_t* q_fp8, const float* w, int64_t n_heads, const uint8_t* key,
                  float key_scale) {
  float k[kIndexKeyDim];
  for (int64_t d = 0; d < kIndexKeyDim; ++d) k[d] = fp8e4m3_to_f32(key[d]);
  float sum = 0;
  for (int64_t h = 0; h < n_heads; ++h) {
    const uint8_t* qh = q_fp8 + h * kIndexKeyDim;
    float dot = 0;
    for (int64_t d = 0; d < kIndexKeyDim; ++d) dot += fp8e4m3_to_f32(qh[d]) * k[d];
    sum += w[h] * std::max(dot, 0.0f);
  }
  return key_scale * sum;
}

void index_scores_fp8(const uint8_t* q8, const float* w, int64_t rows, int64_t heads,
                      const IndexKeys& keys, int64_t key_begin, int64_t key_end, float* scores,
                      int64_t ld, Isa isa) {
  if (isa >= Isa::kAvx512Bf16 && heads % 16 == 0) {
    return index_score_detail::index_scores_avx512(q8, w, rows, heads, keys, key_begin, key_end,
                                                   scores, ld);
  }
  for (int64_t s = key_begin; s < key_end; ++s) {
    const uint8_t* key =
        keys.blocks[size_t(s / kIndexKeyBlock)] + (s % kIndexKeyBlock) * kIndexKeyEntryBytes;
    float ks;
    std::memcpy(&ks, key + kIndexKeyDim, sizeof ks);
    for (int64_t r = 0; r < rows; ++r) {
      scores[r * ld + (s - key_begin)] =
          index_score(q8 + r * heads * kIndexKeyDim, w + r * heads, heads, key, ks);
    }
  }
}

}  // namespace moeserve
