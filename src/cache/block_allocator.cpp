#include "cache/block_allocator.h"

#include "core/check.h"

namespace moeserve {

BlockAllocator::BlockAllocator(int32_t num_blocks)
    : num_blocks_(num_blocks), in_use_(size_t(num_blocks), false) {
  free_.reserve(size_t(num_blocks));
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int32_t> BlockAllocator::allocate() {
  if (free_.empty()) return std::nullopt;
  int32_t b = free_.back();
  free_.pop_back();
  in_use_[size_t(b)] = true;
  return b;
}

bool BlockAllocator::allocate(int32_t n, std::vector<int32_t>* out) {
  if (n > num_free()) return false;
  for (int32_t i = 0; i < n; ++i) out->push_back(*allocate());
  return true;
}

void BlockAllocator::free(int32_t block) {
  CHECK(block >= 0 && block < num_blocks_, "block id out of range");
  CHECK(in_use_[size_t(block)], "double free of a KV block");
  in_use_[size_t(block)] = false;
  free_.push_back(block);
}

}  // namespace moeserve
