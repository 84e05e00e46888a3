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
#include <vector>

#include "core/thread_pool.h"
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

// The positions of the k largest of scores[0, n) (ties: the lower position), ascending.
// nth_element, not a sort of all n.
std::vector<int32_t> top_k_positions(std::span<const float> scores, int64_t k);

// The rows of one sequence: row i is at position first_pos + i and scores keys [0, its position].
struct IndexRows {
  const uint8_t* q8 = nullptr;  // [rows][heads][128] e4m3
  const float* w = nullptr;     // [rows][heads]
  int64_t rows = 0;
  int64_t first_pos = 0;
  IndexKeys keys;  // at least up to the last row's position
};

// Each row's top_k positions by I (index_scores_fp8 at `isa`, then top_k_positions), appended
// to `out` in order, sequence after sequence; a row whose context fits top_k gets an empty
// selection (it attends to everything). Rows of a sequence are scored in groups of up to 8 (a
// block of keys widened once per group) and the keys in chunks of 4096, spread over the pool,
// so that one decode row uses every thread; a row's selection does not depend on the grouping.
void index_topk(std::span<const IndexRows> seqs, int64_t heads, int64_t top_k, ThreadPool* pool,
                std::vector<std::vector<int32_t>>& out, Isa isa = active_isa());

namespace index_score_detail {
// The bytes of BF16(|e4m3 value|) for the 128 magnitudes: 128 low bytes, then 128 high bytes.
const uint8_t* e4m3_bf16_tables();
void index_scores_avx512(const uint8_t* q8, const float* w, int64_t rows, int64_t heads,
                         const IndexKeys& keys, int64_t key_begin, int64_t key_end, float* scores,
                         int64_t ld);
}  // namespace index_score_detail

}  // namespace moeserve
