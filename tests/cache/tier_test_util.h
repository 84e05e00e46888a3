// Test helpers for a KvCache: the scheduler's registration of final blocks; over a lower tier, an
// in-memory tier whose loads can be held back, and the RAM-then-tier lookup the scheduler makes
// at admission, done synchronously.
#pragma once

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "cache/kv_cache.h"

namespace moeserve {

// Blocks in a map: evictions and registrations land there, loads copy from it. With hold set,
// loads wait until release_loads() (a slow disk).
class MapTier final : public KvTier {
 public:
  bool contains(uint64_t hash) override { return blocks.count(hash) > 0; }
  void load(std::shared_ptr<KvLoadJob> job) override {
    held.push_back(std::move(job));
    if (!hold) release_loads();
  }
  void on_register(KvBlock b) override {
    if (keep_registered) blocks[*b.hash] = std::move(b);
  }
  void on_evict(KvBlock b) override { blocks[*b.hash] = std::move(b); }
  // Finishes the held loads: each copies blocks while they are in the map and match.
  void release_loads() {
    for (auto& job : held) {
      int32_t n = 0;
      for (; n < job->size(); ++n) {
        auto it = blocks.find(job->hashes[size_t(n)]);
        if (it == blocks.end() || it->second.parent != job->parent_of(n)) break;
        job->put(n, it->second.bytes);
      }
      job->finish(n);
    }
    held.clear();
  }

  std::map<uint64_t, KvBlock> blocks;
  std::vector<std::shared_ptr<KvLoadJob>> held;
  bool hold = false;
  bool keep_registered = false;
};

// Registers blocks [0, n) of a sequence, as the scheduler does once their tokens are final.
inline std::vector<uint64_t> register_blocks(KvCache& c, std::span<const int32_t> t,
                                             std::span<const int32_t> table, int n) {
  std::vector<uint64_t> hashes;
  uint64_t parent = c.fingerprint();
  for (int b = 0; b < n; ++b) {
    auto bt = t.subspan(size_t(b) * kKvBlockSize, kKvBlockSize);
    uint64_t h = c.chain_hash(parent, bt);
    c.register_block(table[size_t(b)], h, parent, bt);
    hashes.push_back(h);
    parent = h;
  }
  return hashes;
}

// The admission lookup: RAM hits, then what the tier loads beyond them (waited for). Returns
// the blocks found; table also holds the reserved blocks the tier did not fill.
inline int32_t acquire_with_tier(KvCache& c, std::span<const int32_t> tokens, int32_t max_blocks,
                                 std::vector<int32_t>* table, std::vector<uint64_t>* hashes) {
  max_blocks = std::min<int32_t>(max_blocks, int32_t(tokens.size() / kKvBlockSize));
  const int32_t hit = c.acquire_prefix(tokens, max_blocks, table, hashes);
  const uint64_t parent = hit > 0 ? hashes->back() : c.fingerprint();
  std::shared_ptr<KvLoadJob> job = c.start_load(tokens, hit, max_blocks, parent, table);
  if (!job) return hit;
  while (!job->finished()) c.wait_for_load();
  return hit + c.finish_load(*job, std::span<const int32_t>(*table).subspan(size_t(hit)), hashes);
}

}  // namespace moeserve
