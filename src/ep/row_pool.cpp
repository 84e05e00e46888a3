#include "ep/row_pool.h"

#include <algorithm>

namespace moeserve {

namespace {

// Every block starts with a header holding its capacity, so that any pool can take it back.
constexpr size_t kHeader = 64;
constexpr std::align_val_t kAlign{64};

void* allocate_block(size_t bytes) {
  auto* base = static_cast<unsigned char*>(::operator new(kHeader + bytes, kAlign));
  *reinterpret_cast<size_t*>(base) = bytes;
  return base + kHeader;
}

unsigned char* base_of(void* block) {
  return static_cast<unsigned char*>(block) - kHeader;
}

size_t capacity_of(void* block) {
  return *reinterpret_cast<const size_t*>(base_of(block));
}

void free_block(void* block) noexcept {
  ::operator delete(base_of(block), kAlign);
}

}  // namespace

RowPool::~RowPool() {
  for (const Block& b : free_) free_block(b.p);
}

void* RowPool::take(RowPool* pool, size_t bytes) {
  if (!pool) return allocate_block(bytes);
  {
    std::lock_guard<std::mutex> lock(pool->mu_);
    auto best = pool->free_.end();
    for (auto it = pool->free_.begin(); it != pool->free_.end(); ++it) {
      if (it->bytes >= bytes && (best == pool->free_.end() || it->bytes < best->bytes)) best = it;
    }
    if (best != pool->free_.end()) {
      void* p = best->p;
      pool->free_.erase(best);
      return p;
    }
    ++pool->allocated_;
  }
  // Headroom: the next call's rows are rarely exactly as many.
  return allocate_block((bytes + bytes / 4 + 63) / 64 * 64);
}

void RowPool::give(RowPool* pool, void* block) noexcept {
  if (!block) return;
  if (!pool) return free_block(block);
  Block b{block, capacity_of(block)};
  {
    std::lock_guard<std::mutex> lock(pool->mu_);
    if (pool->free_.size() < pool->max_free_) {
      pool->free_.push_back(b);
      return;
    }
    // Full: keep the larger blocks (they serve any smaller call), drop the smallest.
    auto smallest =
        std::min_element(pool->free_.begin(), pool->free_.end(),
                         [](const Block& x, const Block& y) { return x.bytes < y.bytes; });
    if (smallest != pool->free_.end() && smallest->bytes < b.bytes) std::swap(*smallest, b);
  }
  free_block(b.p);
}

size_t RowPool::idle_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

size_t RowPool::blocks_allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

}  // namespace moeserve
