#include "cache/latent_cache.h"

#include <cstring>

#include "core/check.h"

namespace moeserve {

LatentKvCache::LatentKvCache(int64_t n_layers, int64_t dim, int32_t num_blocks, DType dtype)
    : n_layers_(n_layers), dim_(dim), num_blocks_(num_blocks), dtype_(dtype) {
  CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "latent cache is F32 or BF16");
  data_.resize(size_t(n_layers) * size_t(num_blocks) * kKvBlockSize * size_t(dim) *
               dtype_size(dtype));
}

size_t LatentKvCache::offset(int64_t layer, int32_t block, int64_t slot) const {
  CHECK(layer >= 0 && layer < n_layers_ && block >= 0 && block < num_blocks_, "bad KV slot");
  size_t token = (size_t(layer) * size_t(num_blocks_) + size_t(block)) * kKvBlockSize + size_t(slot);
  return token * size_t(dim_) * dtype_size(dtype_);
}

void LatentKvCache::write(int64_t layer, std::span<const int32_t> table, int64_t pos,
                          const float* v) {
  CHECK(pos / kKvBlockSize < int64_t(table.size()), "position beyond the block table");
  uint8_t* p = data_.data() + offset(layer, table[size_t(pos / kKvBlockSize)], pos % kKvBlockSize);
  if (dtype_ == DType::kF32) {
    std::memcpy(p, v, size_t(dim_) * 4);
  } else {
    uint16_t* q = reinterpret_cast<uint16_t*>(p);
    for (int64_t i = 0; i < dim_; ++i) q[i] = f32_to_bf16(v[i]);
  }
}

void LatentKvCache::read(int64_t layer, std::span<const int32_t> table, int64_t pos,
                         float* out) const {
  CHECK(pos / kKvBlockSize < int64_t(table.size()), "position beyond the block table");
  const uint8_t* p =
      data_.data() + offset(layer, table[size_t(pos / kKvBlockSize)], pos % kKvBlockSize);
  if (dtype_ == DType::kF32) {
    std::memcpy(out, p, size_t(dim_) * 4);
  } else {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
    for (int64_t i = 0; i < dim_; ++i) out[i] = bf16_to_f32(q[i]);
  }
}

const uint8_t* LatentKvCache::block_data(int64_t layer, int32_t block) const {
  return data_.data() + offset(layer, block, 0);
}

}  // namespace moeserve
