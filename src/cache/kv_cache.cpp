#include "cache/kv_cache.h"

#include <algorithm>
#include <cstring>

#include <xxhash.h>

#include "core/check.h"

namespace moeserve {

KvCache::KvCache(const KvLayout& layout, int32_t num_blocks, uint64_t fingerprint,
                 int32_t window_pages)
    : layout_(layout),
      fingerprint_(fingerprint),
      allocator_(num_blocks),
      info_(size_t(num_blocks)) {
  CHECK(kv_layout_status(layout).ok(), "KV layout (checked by the caller)");
  latent_part_.resize(size_t(layout.n_layers));
  for (int64_t l = 0; l < layout.n_layers; ++l)
    latent_part_[size_t(l)] = layout.find_part(l, KvPartKind::kLatent);
  data_.resize(size_t(num_blocks) * layout.main_bytes());
  if (windowed()) {
    if (window_pages < 0) window_pages = num_blocks;
    CHECK(window_pages >= 1, "a window pool of at least one page");
    window_data_.resize(size_t(window_pages) * layout.window_bytes());
    window_owner_.assign(size_t(window_pages), -1);
    for (int32_t p = window_pages - 1; p >= 0; --p) window_free_.push_back(p);
  }
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
  // (A block whose window page went is no object to resume from: the tier keeps its own copy
  // from registration.)
  if (tier_ && (!windowed() || has_window(b))) tier_->on_evict(export_block(b));
  lru_.pop_front();
  BlockInfo& i = info_[size_t(b)];
  if (i.window >= 0) free_window(b);
  i.in_lru = false;
  by_hash_.erase(*i.hash);
  i.hash.reset();
  i.parent = 0;
  i.tokens.clear();
  allocator_.free(b);
}

bool KvCache::allocate(int32_t n, std::vector<int32_t>* table, std::vector<int32_t>* holds) {
  return allocate_blocks(n, windowed() ? n : 0, table, holds);
}

bool KvCache::allocate_blocks(int32_t n, int32_t windows, std::vector<int32_t>* table,
                              std::vector<int32_t>* holds) {
  CHECK(windows == 0 || holds != nullptr, "window pages are held by someone");
  if (!release_later_.empty()) reap_loads();
  if (n > num_available() || windows > num_windows_available()) return false;
  while (allocator_.num_free() < n) evict_one();
  for (int32_t k = 0; k < n; ++k) {
    int32_t b = *allocator_.allocate();
    info_[size_t(b)].refs = 1;
    if (k >= n - windows) {
      attach_window(b);
      hold_window(b);
      holds->push_back(int32_t(table->size()));
    }
    table->push_back(b);
  }
  return true;
}

// ---- The window pool ----

void KvCache::attach_window(int32_t b) {
  BlockInfo& i = info_[size_t(b)];
  CHECK(i.window < 0, "a block with a window page already");
  if (window_free_.empty()) {  // the least recently used cached page
    CHECK(!window_lru_.empty(), "a window page counted available");
    free_window(window_lru_.front());
  }
  i.window = window_free_.back();
  window_free_.pop_back();
  window_owner_[size_t(i.window)] = b;
}

void KvCache::hold_window(int32_t b) {
  BlockInfo& i = info_[size_t(b)];
  CHECK(i.window >= 0, "a hold on a block without a window page");
  if (i.in_window_lru) {
    window_lru_.erase(i.window_lru_pos);
    i.in_window_lru = false;
  }
  ++i.window_holds;
}

void KvCache::drop_window(int32_t b) {
  BlockInfo& i = info_[size_t(b)];
  CHECK(i.window >= 0 && i.window_holds > 0, "a window page dropped that was not held");
  if (--i.window_holds > 0) return;
  if (i.hash) {  // cached: a prompt may resume right after this block
    window_lru_.push_back(b);
    i.window_lru_pos = std::prev(window_lru_.end());
    i.in_window_lru = true;
  } else {
    free_window(b);
  }
}

void KvCache::free_window(int32_t b) {
  BlockInfo& i = info_[size_t(b)];
  CHECK(i.window >= 0 && i.window_holds == 0, "a held window page freed");
  if (i.in_window_lru) {
    window_lru_.erase(i.window_lru_pos);
    i.in_window_lru = false;
  }
  window_owner_[size_t(i.window)] = -1;
  window_free_.push_back(i.window);
  i.window = -1;
}

bool KvCache::windows_present(std::span<const int32_t> blocks) const {
  return std::all_of(blocks.begin(), blocks.end(), [&](int32_t b) { return has_window(b); });
}

int32_t KvCache::window_trim_point(int64_t n_computed) const {
  if (!windowed()) return 0;
  return int32_t(std::max<int64_t>(0, (n_computed - (layout_.window() - 1)) / kKvBlockSize));
}

void KvCache::release_windows(std::span<const int32_t> table, std::vector<int32_t>* holds,
                              int32_t before) {
  std::erase_if(*holds, [&](int32_t idx) {
    if (idx >= before) return false;
    drop_window(table[size_t(idx)]);
    return true;
  });
}

void KvCache::release(std::span<const int32_t> table, std::span<const int32_t> holds) {
  for (int32_t idx : holds) drop_window(table[size_t(idx)]);
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
      CHECK(i.window < 0, "a block freed with its window page held");
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
                                std::vector<int32_t>* table, std::vector<uint64_t>* hashes,
                                std::vector<int32_t>* holds) {
  uint64_t parent = fingerprint_;
  std::vector<int32_t> found;
  std::vector<uint64_t> found_hashes;
  while (int32_t(found.size()) < max_blocks &&
         int64_t(found.size() + 1) * kKvBlockSize <= int64_t(tokens.size())) {
    auto block_tokens = tokens.subspan(found.size() * kKvBlockSize, kKvBlockSize);
    const uint64_t h = chain_hash(parent, block_tokens);
    std::optional<int32_t> b = lookup(h, parent, block_tokens);
    if (!b) break;
    found.push_back(*b);
    found_hashes.push_back(h);
    parent = h;
  }
  // With windows: back to the last boundary whose window pages are all still there.
  const int32_t k = window_blocks();
  int32_t n = int32_t(found.size());
  while (n > 0 && !windows_present(std::span<const int32_t>(found).subspan(
                      size_t(std::max(0, n - k)), size_t(std::min(n, k))))) {
    --n;
  }
  CHECK(n == 0 || k == 0 || holds != nullptr, "window pages are held by someone");
  for (int32_t i = 0; i < n; ++i) {
    take(found[size_t(i)]);
    if (i >= n - k) {
      hold_window(found[size_t(i)]);
      holds->push_back(int32_t(table->size()));
    }
    table->push_back(found[size_t(i)]);
    hashes->push_back(found_hashes[size_t(i)]);
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
  // (A block without its window page is no object to resume from: not for the tier.)
  if (add_to_index(block, hash, parent, block_tokens) && tier_ &&
      (!windowed() || has_window(block))) {
    tier_->on_register(export_block(block));
  }
}

// ---- Loading from the tier ----

void KvLoadJob::put(int32_t i, std::span<const uint8_t> bytes) const {
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = piece(at, bytes.size() - at);
    if (uint8_t* d = dest_at(i, at)) std::memcpy(d, bytes.data() + at, n);
    at += n;
  }
}

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
    release(p.second.table, p.second.holds);
    return true;
  });
}

std::shared_ptr<KvLoadJob> KvCache::start_load(std::span<const int32_t> tokens, int32_t first,
                                               int32_t last, uint64_t parent,
                                               std::vector<int32_t>* table,
                                               std::vector<int32_t>* holds) {
  reap_loads();
  CHECK(int64_t(last) * kKvBlockSize <= int64_t(tokens.size()), "loading beyond the tokens");
  const int32_t windows = std::min(last - first, window_blocks());
  if (!tier_ || first >= last || last - first > num_available() ||
      windows > num_windows_available()) {
    return nullptr;
  }
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
  CHECK(allocate_blocks(last - first, windows, table, holds), "blocks counted available");
  job->main_bytes = layout_.main_bytes();
  for (size_t i = at; i < table->size(); ++i) {
    const int32_t b = (*table)[i];
    job->dest.push_back(block_ptr(b));
    job->window_dest.push_back(has_window(b) ? window_ptr(b) : nullptr);
  }
  loads_.push_back(job);
  tier_->load(job);
  return job;
}

int32_t KvCache::finish_load(const KvLoadJob& job, std::span<const int32_t> blocks,
                             std::vector<uint64_t>* hashes) {
  CHECK(job.finished() && blocks.size() == job.dest.size(), "finish_load of another job");
  reap_loads();
  // With windows: resuming after the last loaded block reads the window pages of the blocks
  // before it; short of the blocks that got pages (a miss mid-chain), nothing is usable.
  int32_t n = job.n_loaded();
  const int32_t k = window_blocks();
  if (n > 0 &&
      !windows_present(blocks.subspan(size_t(std::max(0, n - k)), size_t(std::min(n, k))))) {
    n = 0;
  }
  for (int32_t i = 0; i < n; ++i) {
    CHECK(block_ptr(blocks[size_t(i)]) == job.dest[size_t(i)], "finish_load of another job");
    // (A block registered meanwhile under the same hash, computed here, keeps the index entry;
    // this copy is the caller's alone.)
    add_to_index(blocks[size_t(i)], job.hashes[size_t(i)], job.parent_of(i), job.tokens_of(i));
    hashes->push_back(job.hashes[size_t(i)]);
  }
  return n;
}

void KvCache::release_after_load(std::shared_ptr<KvLoadJob> job, std::vector<int32_t> table,
                                 std::vector<int32_t> holds) {
  if (job->finished()) {
    release(table, holds);
  } else {
    release_later_.emplace_back(std::move(job), HeldBlocks{std::move(table), std::move(holds)});
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
  return data_.data() + size_t(block) * layout_.main_bytes();
}

const uint8_t* KvCache::block_ptr(int32_t block) const {
  return const_cast<KvCache*>(this)->block_ptr(block);
}

uint8_t* KvCache::window_ptr(int32_t block) {
  CHECK(block >= 0 && block < num_blocks(), "bad KV block");
  const int32_t page = info_[size_t(block)].window;
  CHECK(page >= 0, "a window entry of a block whose window page went");
  return window_data_.data() + size_t(page) * layout_.window_bytes();
}

const uint8_t* KvCache::window_ptr(int32_t block) const {
  return const_cast<KvCache*>(this)->window_ptr(block);
}

uint8_t* KvCache::latent_ptr(int64_t layer, std::span<const int32_t> table, int64_t pos) {
  CHECK(layer >= 0 && layer < layout_.n_layers, "bad KV layer");
  const int64_t part = latent_part_[size_t(layer)];
  CHECK(part >= 0, "a latent read or written in a layer that keeps none");
  return token_entry(layer, size_t(part), table, pos);
}

void KvCache::write(int64_t layer, std::span<const int32_t> table, int64_t pos, const float* v) {
  kv_token_store(layout_.token, v, latent_ptr(layer, table, pos));
}

void KvCache::read(int64_t layer, std::span<const int32_t> table, int64_t pos, float* out) const {
  kv_token_load(layout_.token, const_cast<KvCache*>(this)->latent_ptr(layer, table, pos), out);
}

const uint8_t* KvCache::layer_base(int64_t layer) const {
  CHECK(layer >= 0 && layer < layout_.n_layers, "bad KV layer");
  const int64_t part = latent_part_[size_t(layer)];
  CHECK(part >= 0, "a latent read or written in a layer that keeps none");
  return part_base(layer, size_t(part));
}

uint8_t* KvCache::part_base(int64_t layer, size_t part) {
  CHECK(layer >= 0 && layer < layout_.n_layers && part < layout_.layer(layer).parts.size(),
        "bad KV part");
  CHECK(!layout_.windowed(layer, part), "a windowed part is reached through its block's page");
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
  return block_entry(layer, part, table[size_t(pos / kKvBlockSize)], pos % kKvBlockSize);
}

uint8_t* KvCache::block_entry(int64_t layer, size_t part, int32_t block, int64_t slot) {
  CHECK(layer >= 0 && layer < layout_.n_layers && part < layout_.layer(layer).parts.size(),
        "bad KV part");
  const KvPart& p = layout_.layer(layer).parts[part];
  CHECK(slot >= 0 && slot < p.entries(), "bad KV entry");
  const size_t at = size_t(slot) * size_t(p.entry_bytes());
  if (layout_.windowed(layer, part)) {
    return window_ptr(block) + (layout_.part_offset(layer, part) - layout_.main_bytes()) + at;
  }
  return block_ptr(block) + layout_.part_offset(layer, part) + at;
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
  b.bytes.assign(p, p + layout_.main_bytes());
  b.bytes.resize(layout_.block_bytes());
  if (has_window(block)) {
    std::memcpy(b.bytes.data() + layout_.main_bytes(), window_ptr(block), layout_.window_bytes());
  }
  return b;
}

bool KvCache::import_block(const KvBlock& b, std::vector<int32_t>* table,
                           std::vector<int32_t>* holds) {
  if (!import_bytes(b.bytes, table, holds)) return false;
  if (b.hash) add_to_index(table->back(), *b.hash, b.parent, b.tokens);  // (the tier has it)
  return true;
}

bool KvCache::import_bytes(std::span<const uint8_t> bytes, std::vector<int32_t>* table,
                           std::vector<int32_t>* holds, bool window) {
  CHECK(bytes.size() == layout_.block_bytes() || (!window && bytes.size() == layout_.main_bytes()),
        "imported KV block of the wrong size");
  if (!allocate_blocks(1, window && windowed() ? 1 : 0, table, holds)) return false;
  const int32_t b = table->back();
  std::memcpy(block_ptr(b), bytes.data(), layout_.main_bytes());
  if (has_window(b)) {
    std::memcpy(window_ptr(b), bytes.data() + layout_.main_bytes(), layout_.window_bytes());
  }
  return true;
}

}  // namespace moeserve
