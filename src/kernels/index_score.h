// The lightning indexer's scores (DeepSeek Sparse Attention, DeepSeek-V3.2; docs/dsa.md): query
// rows against the FP8 index keys of one sequence, as the paged cache keeps them (its kIndexKey
// part: per token kIndexKeyDim e4m3 bytes, then the key's F32 scale). For row r and key s:
//
//   I[r, s] = key_scale[s] * sum_h w[r, h] * ReLU(q8[r, h] . k8[s])
//
// with q8 [rows][heads][128] e4m3 bytes and w [rows][heads] (already times q's scales).
//
// Levels: the scalar reference (index_score: products of the e4m3 values widened to F32, each
// head's dot product summed in order) and, on Isa::kAvx512Bf16 and above when heads is a
// multiple of 16, AVX-512 BF16 dot products (e4m3 values are exact in BF16 and their products
// exact in F32, so only the order of the F32 sums differs: ~1e-6 of the score's magnitude; a
// near-tie of the top-k may resolve differently, which docs/dsa.md states). The BF16 kernel
// holds a row's queries with the heads across the vector lanes and broadcasts the keys' value
// pairs, so a key is read once per row and no transposition is needed; keys are widened to BF16
// a block at a time for all the rows of a call. Pure functions: any thread may call them.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu_features.h"

namespace moeserve {

inline constexpr int64_t kIndexKeyDim = 128;   // values per index key (one FP8 scale)
inline constexpr int64_t kIndexKeyBlock = 64;  // keys per block of the paged cache
inline constexpr int64_t kIndexKeyEntryBytes = kIndexKeyDim + 4;  // e4m3 values, F32 scale

// One key's score for one query (the reference arithmetic).
float index_score(const uint8_t* q_fp8, const float* w, int64_t n_heads, const uint8_t* key,
                  float key_scale);

// A sequence's keys: block b holds keys [64b, 64b + 64), kIndexKeyEntryBytes apart.
struct IndexKeys {
  std::span<const uint8_t* const> blocks;
};

// scores[r * ld + (s - key_begin)] = I[r, s] for r < rows, key_begin <= s < key_end.
void index_scores_fp8(const uint8_t* q8, const float* w, int64_t rows, int64_t heads,
                      const IndexKeys& keys, int64_t key_begin, int64_t key_end, float* scores,
                      int64_t ld, Isa isa = active_isa());

namespace index_score_detail {
void index_scores_avx512(const uint8_t* q8, const float* w, int64_t rows, int64_t heads,
                         const IndexKeys& keys, int64_t key_begin, int64_t key_end, float* scores,
                         int64_t ld);
}  // namespace index_score_detail

}  // namespace moeserve
