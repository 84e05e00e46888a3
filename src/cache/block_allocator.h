// BlockAllocator: hands out ids of fixed-size KV cache blocks [0, num_blocks) from a free list.
// Not thread-safe: owned by one scheduler thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace moeserve {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  std::optional<int32_t> allocate();
  // Allocates n blocks or none (returns false and leaves the free list unchanged).
  bool allocate(int32_t n, std::vector<int32_t>* out);
  void free(int32_t block);
  int32_t num_free() const { return int32_t(free_.size()); }
  int32_t num_blocks() const { return num_blocks_; }

 private:
  int32_t num_blocks_;
  std::vector<int32_t> free_;  // stack; lowest ids handed out first
  std::vector<bool> in_use_;
};

}  // namespace moeserve
