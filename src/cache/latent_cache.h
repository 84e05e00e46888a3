// LatentKvCache: the paged MLA cache. Per layer, a pool of blocks of `block_size` tokens; each
// token holds `dim` values = kv_lora_rank normalised latent values then qk_rope_head_dim
// rotated rope-key values (FlashMLA's layout: [layer][block][token in block][dim]).
// A sequence owns a block table (block ids in order); token t lives in block table[t / 64] at
// offset t % 64. Storage is F32 (reference path) or BF16 (the served format, 1152 bytes per
// token per layer for V3). Reads and writes of distinct tokens may happen from different threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"

namespace moeserve {

inline constexpr int64_t kKvBlockSize = 64;

class LatentKvCache {
 public:
  LatentKvCache(int64_t n_layers, int64_t dim, int32_t num_blocks, DType dtype);

  int64_t n_layers() const { return n_layers_; }
  int64_t dim() const { return dim_; }
  int32_t num_blocks() const { return num_blocks_; }
  DType dtype() const { return dtype_; }
  size_t bytes() const { return data_.size(); }

  // Writes dim values for token `pos` of the sequence with this block table.
  void write(int64_t layer, std::span<const int32_t> block_table, int64_t pos, const float* v);
  // Reads dim values (converted to float).
  void read(int64_t layer, std::span<const int32_t> block_table, int64_t pos, float* out) const;
  // Raw pointer to one block's storage: [kKvBlockSize][dim] elements of dtype().
  const uint8_t* block_data(int64_t layer, int32_t block) const;

 private:
  size_t offset(int64_t layer, int32_t block, int64_t slot) const;

  int64_t n_layers_, dim_;
  int32_t num_blocks_;
  DType dtype_;
  std::vector<uint8_t> data_;
};

}  // namespace moeserve
