#include "cache/kv_cache.h"

#include <algorithm>
#include <cstring>

#include <xxhash.h>

#include "core/check.h"

namespace moeserve {

KvCache::KvCache(const KvLayout& layout, int32_t num_blocks, uint64_t fingerprint)
    : layout_(layout),
      fingerprint_(fingerprint),
      allocator_(num_blocks),
      info_(size_t(num_blocks)) {
  CHECK(kv_layout_status(layout).ok(), "KV layout (checked by the caller)");
  latent_part_.resize(size_t(layout.n_layers));
  for (int64_t l = 0; l < layout.n_layers; ++l)
    latent_part_[size_t(l)] = layout.find_part(l, KvPartKind::kLatent);
  data_.resize(size_t(num_blocks) * layout.block_bytes());
}

KvCache::~KvCache() {
  std::unique_lock<std::mutex> lock(load_signal_->mu);
  load_signal_->cv.wait(lock, [&] {
    return std::all_of(loads_.begin(), loads_.end(), [](const auto& j) { return j->finished(); });
  });
}

// ---- Block ids ----

void KvCache::take(int32_t b) {
  BlockInfo& i = info_[size_t(b)];
  if (i.in_lru) {
    lru_.erase(i.lru_pos);
    i.in_lru = false;
  }
  ++i.refs;
}

void KvCache::evict_one() {
  CHECK(!lru_.empty(), "evict with nothing evictable");
  int32_t b = lru_.front();
  if (tier_) tier_->on_evict(export_block(b));
  lru_.pop_front();
  BlockInfo& i = info_[size_t(b)];
  i.in_lru = false;
  by_hash_.erase(*i.hash);
  i.hash.reset();
  i.parent = 0;
  i.tokens.clear();
  allocator_.free(b);
}

bool KvCache::allocate(int32_t n, std::vector<int32_t>* table) {
  if (!release_later_.empty()) reap_loads();
  if (n > num_available()) return false;
  while (allocator_.num_free() < n) evict_one();
  for (int32_t k = 0; k < n; ++k) {
    int32_t b = *allocator_.allocate();
    info_[size_t(b)].refs = 1;
    table->push_back(b);
  }
  return true;
}

void KvCache::release(std::span<const int32_t> table) {
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

// ---- Prefix index ----

uint64_t KvCache::chain_hash(uint64_t parent, std::span<const int32_t> t) const {
  return XXH3_64bits_withSeed(t.data(), t.size() * sizeof(int32_t), parent);
}

std::optional<int32_t> KvCache::lookup(uint64_t hash, uint64_t parent,
                                       std::span<const int32_t> tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const BlockInfo& i = info_[size_t(it->second)];
  if (i.parent != parent || !std::equal(i.tokens.begin(), i.tokens.end(), tokens.begin())) {
    return std::nullopt;
  }
  return it->second;
}

int32_t KvCache::acquire_prefix(std::span<const int32_t> tokens, int32_t max_blocks,
                                std::vector<int32_t>* table, std::vector<uint64_t>* hashes) {
  uint64_t parent = fingerprint_;
  int32_t n = 0;
  while (n < max_blocks && int64_t(n + 1) * kKvBlockSize <= int64_t(tokens.size())) {
    auto block_tokens = tokens.subspan(size_t(n) * kKvBlockSize, kKvBlockSize);
    const uint64_t h = chain_hash(parent, block_tokens);
    std::optional<int32_t> b = lookup(h, parent, block_tokens);
    if (!b) break;
    take(*b);
    table->push_back(*b);
    hashes->push_back(h);
    parent = h;
    ++n;
  }
  return n;
}

bool KvCache::add_to_index(int32_t block, uint64_t hash, uint64_t parent,
                           std::span<const int32_t> block_tokens) {
  CHECK(int64_t(block_tokens.size()) == kKvBlockSize, "only full blocks are registered");
  BlockInfo& i = info_[size_t(block)];
  if (i.hash || by_hash_.count(hash)) return false;  // already registered (here or elsewhere)
  i.hash = hash;
  i.parent = parent;
  i.tokens.assign(block_tokens.begin(), block_tokens.end());
  by_hash_[hash] = block;
  return true;
}

void KvCache::register_block(int32_t block, uint64_t hash, uint64_t parent,
                             std::span<const int32_t> block_tokens) {
  if (add_to_index(block, hash, parent, block_tokens) && tier_) {
    tier_->on_register(export_block(block));
  }
}

// ---- Loading from the tier ----

void KvLoadJob::finish(int32_t n) {
  n_loaded_ = n;
  std::shared_ptr<Signal> s = signal;  // (the job may go once finished is seen)
  std::lock_guard<std::mutex> lock(s->mu);
  finished_.store(true, std::memory_order_release);
  s->cv.notify_all();
}

void KvCache::reap_loads() {
  std::erase_if(loads_, [](const auto& j) { return j->finished(); });
  std::erase_if(release_later_, [&](auto& p) {
    if (!p.first->finished()) return false;
    release(p.second);
    return true;
  });
}

std::shared_ptr<KvLoadJob> KvCache::start_load(std::span<const int32_t> tokens, int32_t first,
                                               int32_t last, uint64_t parent,
                                               std::vector<int32_t>* table) {
  reap_loads();
  CHECK(int64_t(last) * kKvBlockSize <= int64_t(tokens.size()), "loading beyond the tokens");
  if (!tier_ || first >= last || last - first > num_available()) return nullptr;
  auto job = std::make_shared<KvLoadJob>();
  job->parent = parent;
  job->signal = load_signal_;
  for (int32_t b = first; b < last; ++b) {
    auto block_tokens = tokens.subspan(size_t(b) * kKvBlockSize, kKvBlockSize);
    parent = chain_hash(parent, block_tokens);
    job->hashes.push_back(parent);
    job->tokens.insert(job->tokens.end(), block_tokens.begin(), block_tokens.end());
  }
  if (!tier_->contains(job->hashes[0])) return nullptr;
  const size_t at = table->size();
  CHECK(allocate(last - first, table), "blocks counted available");
  for (size_t i = at; i < table->size(); ++i) job->dest.push_back(block_ptr((*table)[i]));
  loads_.push_back(job);
  tier_->load(job);
  return job;
}

int32_t KvCache::finish_load(const KvLoadJob& job, std::span<const int32_t> blocks,
                             std::vector<uint64_t>* hashes) {
  CHECK(job.finished() && blocks.size() == job.dest.size(), "finish_load of another job");
  reap_loads();
  for (int32_t i = 0; i < job.n_loaded(); ++i) {
    CHECK(block_ptr(blocks[size_t(i)]) == job.dest[size_t(i)], "finish_load of another job");
    // (A block registered meanwhile under the same hash, computed here, keeps the index entry;
    // this copy is the caller's alone.)
    add_to_index(blocks[size_t(i)], job.hashes[size_t(i)], job.parent_of(i), job.tokens_of(i));
    hashes->push_back(job.hashes[size_t(i)]);
  }
  return job.n_loaded();
}

void KvCache::release_after_load(std::shared_ptr<KvLoadJob> job, std::vector<int32_t> table) {
  if (job->finished()) {
    release(table);
  } else {
    release_later_.emplace_back(std::move(job), std::move(table));
  }
  reap_loads();
}

int32_t KvCache::loads_in_flight() {
  reap_loads();
  return int32_t(loads_.size());
}

void KvCache::wait_for_load() {
  std::unique_lock<std::mutex> lock(load_signal_->mu);
  load_signal_->cv.wait(lock, [&] {
    return loads_.empty() ||
           std::any_of(loads_.begin(), loads_.end(), [](const auto& j) { return j->finished(); });
  });
}

// ---- Bytes ----

uint8_t* KvCache::block_ptr(int32_t block) {
  CHECK(block >= 0 && block < num_blocks(), "bad KV block");
  return data_.data() + size_t(block) * layout_.block_bytes();
}

const uint8_t* KvCache::block_ptr(int32_t block) const {
  CHECK(block >= 0 && block < num_blocks(), "bad KV block");
  return data_.data() + size_t(block) * layout_.block_bytes();
}

size_t KvCache::token_offset(int64_t layer, int32_t block, int64_t slot) const {
  CHECK(layer >= 0 && layer < layout_.n_layers && block >= 0 && block < num_blocks(),
        "bad KV slot");
  const int64_t part = latent_part_[size_t(layer)];
  CHECK(part >= 0, "a latent read or written in a layer that keeps none");
  return size_t(block) * layout_.block_bytes() + layout_.part_offset(layer, size_t(part)) +
         size_t(slot) * layout_.token_bytes();
}

void KvCache::write(int64_t layer, std::span<const int32_t> table, int64_t pos, const float* v) {
  CHECK(pos / kKvBlockSize < int64_t(table.size()), "position beyond the block table");
  uint8_t* p =
      data_.data() + token_offset(layer, table[size_t(pos / kKvBlockSize)], pos % kKvBlockSize);
  kv_token_store(layout_.token, v, p);
}

void KvCache::read(int64_t layer, std::span<const int32_t> table, int64_t pos, float* out) const {
  CHECK(pos / kKvBlockSize < int64_t(table.size()), "position beyond the block table");
  const uint8_t* p =
      data_.data() + token_offset(layer, table[size_t(pos / kKvBlockSize)], pos % kKvBlockSize);
  kv_token_load(layout_.token, p, out);
}

const uint8_t* KvCache::layer_base(int64_t layer) const {
  return data_.data() + token_offset(layer, 0, 0);
}

uint8_t* KvCache::part_base(int64_t layer, size_t part) {
  CHECK(layer >= 0 && layer < layout_.n_layers && part < layout_.layer(layer).parts.size(),
        "bad KV part");
  return data_.data() + layout_.part_offset(layer, part);
}

const uint8_t* KvCache::part_base(int64_t layer, size_t part) const {
  return const_cast<KvCache*>(this)->part_base(layer, part);
}

uint8_t* KvCache::token_entry(int64_t layer, size_t part, std::span<const int32_t> table,
                              int64_t pos) {
  CHECK(pos >= 0 && pos / kKvBlockSize < int64_t(table.size()), "position beyond the block table");
  const KvPart& p = layout_.layer(layer).parts.at(part);
  CHECK(p.ratio == 1 && p.kind != KvPartKind::kState, "a per-token part");
  const int32_t block = table[size_t(pos / kKvBlockSize)];
  CHECK(block >= 0 && block < num_blocks(), "bad KV block");
  return part_base(layer, part) + size_t(block) * layout_.block_bytes() +
         size_t(pos % kKvBlockSize) * size_t(p.entry_bytes());
}

const uint8_t* KvCache::token_entry(int64_t layer, size_t part, std::span<const int32_t> table,
                                    int64_t pos) const {
  return const_cast<KvCache*>(this)->token_entry(layer, part, table, pos);
}

// ---- Blocks as objects ----

KvBlock KvCache::export_block(int32_t block) const {
  const BlockInfo& i = info_[size_t(block)];
  KvBlock b;
  b.hash = i.hash;
  b.parent = i.parent;
  b.tokens = i.tokens;
  const uint8_t* p = block_ptr(block);
  b.bytes.assign(p, p + layout_.block_bytes());
  return b;
}

bool KvCache::import_block(const KvBlock& b, std::vector<int32_t>* table) {
  if (!import_bytes(b.bytes, table)) return false;
  if (b.hash) add_to_index(table->back(), *b.hash, b.parent, b.tokens);  // (the tier has it)
  return true;
}

bool KvCache::import_bytes(std::span<const uint8_t> bytes, std::vector<int32_t>* table) {
  CHECK(bytes.size() == layout_.block_bytes(), "imported KV block of the wrong size");
  if (!allocate(1, table)) return false;
  std::memcpy(block_ptr(table->back()), bytes.data(), bytes.size());
  return true;
}

}  // namespace moeserve
