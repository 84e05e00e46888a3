// KvBlockManager: KV cache blocks with reference counts and a prefix cache.
//
// A full block (64 tokens) whose KV has been computed can be registered under the hash chain of
// its tokens: hash(block i) = H(hash(block i-1), tokens of block i). A later request whose prompt
// starts with the same tokens reuses those blocks (refcount + 1) instead of recomputing them.
// Blocks no sequence references stay cached (evictable, least recently used first) until the
// free list runs dry; a block is never evicted while referenced. Lookups compare the stored
// tokens too, so a hash collision cannot return wrong KV.
//
// Not thread-safe: owned by the engine's step thread.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_allocator.h"
#include "cache/latent_cache.h"

namespace moeserve {

class KvBlockManager {
 public:
  explicit KvBlockManager(int32_t num_blocks);

  int32_t num_blocks() const { return allocator_.num_blocks(); }
  // Blocks that can be handed out now (free or evictable).
  int32_t num_available() const { return allocator_.num_free() + int32_t(lru_.size()); }
  int32_t num_used() const { return num_blocks() - num_available(); }

  // The longest run of cached full blocks that prefixes `tokens`, at most max_blocks of them;
  // each returned block gets a reference. Appends to `table`.
  int32_t acquire_prefix(std::span<const int32_t> tokens, int32_t max_blocks,
                         std::vector<int32_t>* table);
  // n fresh blocks (evicting cached ones if needed), or false with nothing taken.
  bool allocate(int32_t n, std::vector<int32_t>* table);
  // Registers block `index` of a sequence (table[index]) as holding tokens[index*64, +64),
  // once its KV is computed. Needs the blocks before it registered (or index 0).
  void register_full_block(std::span<const int32_t> tokens, std::span<const int32_t> table,
                           int32_t index);
  // Drops one reference to each block of the table.
  void release(std::span<const int32_t> table);

  int32_t refcount(int32_t block) const { return info_[size_t(block)].refs; }
  int32_t cached_blocks() const { return int32_t(by_hash_.size()); }

 private:
  struct BlockInfo {
    int32_t refs = 0;
    std::optional<uint64_t> hash;  // set while registered in by_hash_
    std::vector<int32_t> tokens;   // the registered block's tokens (collision check)
    std::list<int32_t>::iterator lru_pos;
    bool in_lru = false;
  };

  static uint64_t chain_hash(uint64_t parent, std::span<const int32_t> block_tokens);
  void evict_one();
  void take(int32_t block);

  BlockAllocator allocator_;
  std::vector<BlockInfo> info_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::list<int32_t> lru_;  // unreferenced cached blocks, least recently used first
};

}  // namespace moeserve
