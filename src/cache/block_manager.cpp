#include "cache/block_manager.h"

#include <algorithm>

#include <xxhash.h>

#include "core/check.h"

namespace moeserve {

KvBlockManager::KvBlockManager(int32_t num_blocks)
    : allocator_(num_blocks), info_(size_t(num_blocks)) {}

uint64_t KvBlockManager::chain_hash(uint64_t parent, std::span<const int32_t> t) {
  return XXH3_64bits_withSeed(t.data(), t.size() * sizeof(int32_t), parent);
}

void KvBlockManager::take(int32_t b) {
  BlockInfo& i = info_[size_t(b)];
  if (i.in_lru) {
    lru_.erase(i.lru_pos);
    i.in_lru = false;
  }
  ++i.refs;
}

int32_t KvBlockManager::acquire_prefix(std::span<const int32_t> tokens, int32_t max_blocks,
                                       std::vector<int32_t>* table) {
  uint64_t h = 0;
  int32_t n = 0;
  while (n < max_blocks && int64_t(n + 1) * kKvBlockSize <= int64_t(tokens.size())) {
    auto block_tokens = tokens.subspan(size_t(n) * kKvBlockSize, kKvBlockSize);
    h = chain_hash(h, block_tokens);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const BlockInfo& i = info_[size_t(it->second)];
    if (!std::equal(i.tokens.begin(), i.tokens.end(), block_tokens.begin())) break;
    take(it->second);
    table->push_back(it->second);
    ++n;
  }
  return n;
}

void KvBlockManager::evict_one() {
  CHECK(!lru_.empty(), "evict with nothing evictable");
  int32_t b = lru_.front();
  lru_.pop_front();
  BlockInfo& i = info_[size_t(b)];
  i.in_lru = false;
  by_hash_.erase(*i.hash);
  i.hash.reset();
  i.tokens.clear();
  allocator_.free(b);
}

bool KvBlockManager::allocate(int32_t n, std::vector<int32_t>* table) {
  if (n > num_available()) return false;
  while (allocator_.num_free() < n) evict_one();
  for (int32_t k = 0; k < n; ++k) {
    int32_t b = *allocator_.allocate();
    info_[size_t(b)].refs = 1;
    table->push_back(b);
  }
  return true;
}

void KvBlockManager::register_full_block(std::span<const int32_t> tokens,
                                         std::span<const int32_t> table, int32_t index) {
  uint64_t parent = 0;
  if (index > 0) {
    const BlockInfo& prev = info_[size_t(table[size_t(index - 1)])];
    if (!prev.hash) return;  // the chain is broken (the previous block lost a race): skip
    parent = *prev.hash;
  }
  auto block_tokens = tokens.subspan(size_t(index) * kKvBlockSize, kKvBlockSize);
  uint64_t h = chain_hash(parent, block_tokens);
  BlockInfo& i = info_[size_t(table[size_t(index)])];
  if (i.hash || by_hash_.count(h)) return;  // already registered (here or in another block)
  i.hash = h;
  i.tokens.assign(block_tokens.begin(), block_tokens.end());
  by_hash_[h] = table[size_t(index)];
}

void KvBlockManager::release(std::span<const int32_t> table) {
  // Last block first, so that a chain's head is the most recently used and is evicted last
  // (the rest of a chain is unreachable without its head).
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    int32_t b = *it;
    BlockInfo& i = info_[size_t(b)];
    CHECK(i.refs > 0, "release of an unreferenced block");
    if (--i.refs > 0) continue;
    if (i.hash) {
      lru_.push_back(b);
      i.lru_pos = std::prev(lru_.end());
      i.in_lru = true;
    } else {
      allocator_.free(b);
    }
  }
}

}  // namespace moeserve
