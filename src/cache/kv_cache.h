// KvCache: the one owner of the paged latent KV cache: block ids (allocator and reference
// counts), the prefix index (hash chain of full blocks), the bytes, and the hooks of a lower
// tier (docs/engine.md "The block owner").
//
// Bytes. A block holds kKvBlockSize (64) tokens of every layer, block-major, as its KvLayout
// (cache/kv_layout.h) says: [block][layer][part][entry][entry bytes]. For V2/V3 every layer has
// one part, the latent per token: kv_lora_rank normalised latent values then qk_rope_head_dim
// rotated rope-key values (FlashMLA's per-layer layout inside a block) in one of the formats of
// kernels/kv_token.h: F32 (reference path), BF16 (the served default: 1,152 bytes per token per
// layer for V3) or FlashMLA's FP8 with scale (656 bytes). One block is one object whatever its
// parts (export_block / import_block, the disk tier, PD hand-off); in memory its main region is
// contiguous and, with sliding windows, its window region is a page of the window pool (below).
// A layer's view of one main-region part of the pool is a base pointer plus a block stride.
//
// Prefix index. A full block whose tokens are final is registered under its chain hash:
// hash(block 0) = H(fingerprint, tokens of block 0), hash(block i) = H(hash(block i - 1),
// tokens of block i). The fingerprint names the model and everything else that changes KV bits
// (docs/engine.md), so two models never share a chain. A later prompt that starts with the
// same tokens takes those blocks (reference + 1) instead of recomputing them. Lookups compare
// the stored tokens and parent hash too, so a hash collision cannot return wrong KV.
// Unreferenced registered blocks stay cached (evictable, least recently used first) until the
// free list runs dry; a referenced block is never evicted.
//
// The window pool (docs/kv-cache.md, "The window pool"). A layout whose layers have a sliding
// window (V4) keeps each block's window region (KvLayout::main_bytes() on) in a page of a second,
// smaller pool. A sequence holds the window pages of the blocks it still reads over a window
// (`holds`: indices into its block table); once a block falls behind every window it lets go,
// and the page is freed, or, when the block is registered, kept as cached (evictable, least
// recently used first) so that a later prompt can resume right after it. A prefix hit ends only
// where the window pages of the window_blocks() blocks before it are still there.
//
// Lower tier (KvTier). Beyond a RAM prefix hit, the blocks the tier holds are loaded
// asynchronously: start_load takes fresh blocks and hands them to the tier's I/O thread, which
// fills them while steps go on; finish_load registers what arrived. A block registered from KV
// computed here, and a registered block about to be evicted, are shown to the tier, bytes
// intact.
//
// Not thread-safe: owned by the engine's step thread. Reads and writes of distinct tokens'
// bytes may happen from the step's worker threads, and a tier's I/O thread writes the blocks
// of the loads in flight (blocks nobody else holds).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_allocator.h"
#include "cache/kv_layout.h"
#include "core/dtype.h"
#include "kernels/kv_token.h"

namespace moeserve {

// Bump when the byte layout of a block changes: it is part of the fingerprint.
inline constexpr uint32_t kKvLayoutVersion = 2;  // 2: block-major [block][layer][token][dim]

// Blocks needed to hold n tokens.
inline int32_t blocks_for(int64_t n_tokens) {
  return int32_t((n_tokens + kKvBlockSize - 1) / kKvBlockSize);
}

// One block as an object of its own: what export_block gives and import_block takes.
struct KvBlock {
  std::optional<uint64_t> hash;  // chain hash; set for registered (full, final) blocks
  uint64_t parent = 0;           // the previous block's chain hash (the fingerprint for block 0)
  std::vector<int32_t> tokens;   // the block's tokens (kKvBlockSize when hash is set)
  std::vector<uint8_t> bytes;    // [n_layers][kKvBlockSize][the layout's token bytes]

  friend bool operator==(const KvBlock&, const KvBlock&) = default;
};

// Blocks on their way up from a lower tier (KvCache::start_load). Shared by the cache (on its
// owner thread) and the tier's I/O thread: the tier fills the destination blocks in chain
// order and calls finish(); after finish() it touches nothing of the cache.
struct KvLoadJob {
  struct Signal {  // shared by a cache's jobs: finish() wakes KvCache::wait_for_load
    std::mutex mu;
    std::condition_variable cv;
  };

  uint64_t parent = 0;           // the chain hash before the first block
  std::vector<uint64_t> hashes;  // [n] chain hashes, in chain order
  std::vector<int32_t> tokens;   // [n * kKvBlockSize] the blocks' tokens
  // [n] where block i goes: bytes [0, main_bytes) to dest[i], the rest (the window region) to
  // window_dest[i], or nowhere when that is null (a block the loading sequence will not read
  // over a window; the bytes still count for the object's checksum).
  std::vector<uint8_t*> dest;
  std::vector<uint8_t*> window_dest;
  size_t main_bytes = 0;
  std::shared_ptr<Signal> signal;

  int32_t size() const { return int32_t(hashes.size()); }
  uint64_t parent_of(int32_t i) const { return i == 0 ? parent : hashes[size_t(i - 1)]; }
  std::span<const int32_t> tokens_of(int32_t i) const {
    return std::span<const int32_t>(tokens).subspan(size_t(i) * kKvBlockSize, kKvBlockSize);
  }
  // Where bytes [at, at + n) of block i go, for n up to piece(at, n): null when they go
  // nowhere (the window region of a block without a page).
  uint8_t* dest_at(int32_t i, size_t at) const {
    if (at < main_bytes) return dest[size_t(i)] + at;
    uint8_t* w = window_dest[size_t(i)];
    return w ? w + (at - main_bytes) : nullptr;
  }
  size_t piece(size_t at, size_t n) const {
    return at < main_bytes ? std::min(n, main_bytes - at) : n;
  }
  // All of block i's bytes, to where they go.
  void put(int32_t i, std::span<const uint8_t> bytes) const;
  // The tier: the first n blocks hold verified KV (the rest may hold anything).
  void finish(int32_t n);
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  int32_t n_loaded() const { return n_loaded_; }  // valid once finished()

 private:
  int32_t n_loaded_ = 0;
  std::atomic<bool> finished_{false};
};

// A tier below the RAM pool (the disk tier; later a remote store). contains/load/on_register/
// on_evict are called by the cache's owner thread; load's reading happens on the tier's own.
class KvTier {
 public:
  virtual ~KvTier() = default;
  // Whether the tier has an object under `hash` (a cheap probe: a load is started only then).
  virtual bool contains(uint64_t hash) = 0;
  // Reads the job's blocks in chain order into their destinations, stopping at the first one it
  // does not have or cannot verify, then calls job->finish(n). Must not block the caller; must
  // finish every job it took, also when it is destroyed.
  virtual void load(std::shared_ptr<KvLoadJob> job) = 0;
  // A block was just registered from KV computed here (not loaded): the tier's own copy.
  virtual void on_register(KvBlock block) { (void)block; }
  // A registered block leaves RAM: the tier's own copy.
  virtual void on_evict(KvBlock block) = 0;
};

class KvCache {
 public:
  // window_pages: the window pool's pages (a layout with windows; -1: one per block).
  KvCache(const KvLayout& layout, int32_t num_blocks, uint64_t fingerprint = 0,
          int32_t window_pages = -1);
  ~KvCache();  // waits for the loads in flight (they write into the pool)
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvLayout& layout() const { return layout_; }
  int64_t n_layers() const { return layout_.n_layers; }
  int64_t dim() const { return layout_.token.dim(); }
  DType dtype() const { return layout_.token.dtype; }
  uint64_t fingerprint() const { return fingerprint_; }
  void set_tier(KvTier* tier) { tier_ = tier; }  // borrowed; null: none

  // ---- Block ids ----
  int32_t num_blocks() const { return allocator_.num_blocks(); }
  // Blocks that can be handed out now (free or evictable).
  int32_t num_available() const { return allocator_.num_free() + int32_t(lru_.size()); }
  int32_t num_used() const { return num_blocks() - num_available(); }
  // n fresh blocks (evicting cached ones if needed), each with one reference, appended to
  // table; or false with nothing taken. With windows, each also gets a window page, held (its
  // table index appended to holds, which must then be given).
  bool allocate(int32_t n, std::vector<int32_t>* table, std::vector<int32_t>* holds = nullptr);
  // Drops the window holds (indices into table), then one reference to each block of the table
  // (last block first).
  void release(std::span<const int32_t> table, std::span<const int32_t> holds = {});
  int32_t refcount(int32_t block) const { return info_[size_t(block)].refs; }

  // ---- The window pool ----
  bool windowed() const { return layout_.window_bytes() > 0; }
  int32_t window_blocks() const { return windowed() ? layout_.window_blocks() : 0; }
  int32_t window_pages() const { return int32_t(window_owner_.size()); }
  // Pages that can be handed out now (free or cached).
  int32_t num_windows_available() const {
    return int32_t(window_free_.size() + window_lru_.size());
  }
  bool has_window(int32_t block) const { return info_[size_t(block)].window >= 0; }
  int32_t window_holds(int32_t block) const { return info_[size_t(block)].window_holds; }
  // The first block a sequence with n_computed tokens still reads over a window: every block
  // before it can let its window page go.
  int32_t window_trim_point(int64_t n_computed) const;
  // Drops the holds (in *holds) of table indices below `before`, and removes them from *holds.
  void release_windows(std::span<const int32_t> table, std::vector<int32_t>* holds, int32_t before);

  // ---- Prefix index ----
  // The chain hash of a block whose predecessor's hash is `parent` (the fingerprint for the
  // first block).
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> block_tokens) const;
  // The longest run of cached full blocks in RAM that prefixes `tokens`, at most max_blocks of
  // them, and with windows, whose last window_blocks() blocks still have their window pages;
  // each gets a reference and is appended to `table`, its hash to `hashes` (and the pages of
  // those last blocks are held: `holds`).
  int32_t acquire_prefix(std::span<const int32_t> tokens, int32_t max_blocks,
                         std::vector<int32_t>* table, std::vector<uint64_t>* hashes,
                         std::vector<int32_t>* holds = nullptr);
  // Registers `block` as holding the final KV of `block_tokens` (kKvBlockSize of them) under
  // `hash` (= chain_hash(parent, block_tokens)). A no-op when the block or the hash is already
  // registered.
  void register_block(int32_t block, uint64_t hash, uint64_t parent,
                      std::span<const int32_t> block_tokens);
  int32_t cached_blocks() const { return int32_t(by_hash_.size()); }
  bool is_registered(int32_t block) const { return info_[size_t(block)].hash.has_value(); }

  // ---- Loading from the tier (docs/kv-cache.md "The disk tier") ----
  // When the tier holds full block `first` of `tokens` (whose predecessor's chain hash is
  // `parent`): allocates fresh blocks for full blocks [first, last) (appended to `table`; with
  // windows, the last window_blocks() of them with held window pages) and starts loading them.
  // nullptr, nothing taken, when there is no tier, the tier lacks block `first`, or fewer
  // blocks are available.
  std::shared_ptr<KvLoadJob> start_load(std::span<const int32_t> tokens, int32_t first,
                                        int32_t last, uint64_t parent, std::vector<int32_t>* table,
                                        std::vector<int32_t>* holds = nullptr);
  // A finished job: its loaded blocks (the job's first n_loaded() of `blocks`, which are the
  // job's destinations) join the prefix index, their hashes are appended to `hashes`; returns
  // how many: n_loaded(), or with windows 0 when the load stopped short of the blocks that got
  // window pages (nothing to resume from then). The other blocks stay the caller's, fresh.
  int32_t finish_load(const KvLoadJob& job, std::span<const int32_t> blocks,
                      std::vector<uint64_t>* hashes);
  // Releases `table` (which holds the job's destinations) once the job has finished: now if it
  // has, else when it does (a sequence that went away while loading).
  void release_after_load(std::shared_ptr<KvLoadJob> job, std::vector<int32_t> table,
                          std::vector<int32_t> holds = {});
  // Jobs started and not finished yet.
  int32_t loads_in_flight();
  // Blocks until a job in flight finishes (at once when none is in flight or one has finished).
  void wait_for_load();

  // ---- Bytes ----
  // (The window region's parts, KvLayout::windowed, are reached only through write, read,
  // token_entry and block_entry, and only in blocks holding a window page; part_base and
  // layer_base serve the main region.)
  // Stores dim values as token `pos` of the sequence with this block table (rounded or
  // quantized to the layout's format: kv_token_store).
  // (The layer's kLatent part.)
  void write(int64_t layer, std::span<const int32_t> block_table, int64_t pos, const float* v);
  // Reads dim values back as floats (the stored values, exactly).
  void read(int64_t layer, std::span<const int32_t> block_table, int64_t pos, float* out) const;
  // One layer's view of the pool: block b's kKvBlockSize tokens of layout().token_bytes() each
  // start at layer_base(layer) + b * block_stride_bytes().
  const uint8_t* layer_base(int64_t layer) const;
  // Any part: block b's entries of layer `layer`'s part `part` (an index into its parts), of
  // layout().layer(layer).parts[part].entry_bytes() each, start at part_base(layer, part) +
  // b * block_stride_bytes().
  uint8_t* part_base(int64_t layer, size_t part);
  const uint8_t* part_base(int64_t layer, size_t part) const;
  // The entry of position `pos` of the sequence with this block table in a per-token part
  // (ratio 1) of a layer.
  uint8_t* token_entry(int64_t layer, size_t part, std::span<const int32_t> block_table,
                       int64_t pos);
  const uint8_t* token_entry(int64_t layer, size_t part, std::span<const int32_t> block_table,
                             int64_t pos) const;
  int64_t block_stride_bytes() const { return int64_t(layout_.main_bytes()); }
  // Entry `slot` of layer `layer`'s part `part` in block `block`, in either region (a window
  // region part only while the block has its page).
  uint8_t* block_entry(int64_t layer, size_t part, int32_t block, int64_t slot);

  // ---- Blocks as objects ----
  // A copy of block `block` (registered or not; tokens/hash/parent as registered, else empty);
  // a window region without a page reads as zeros.
  KvBlock export_block(int32_t block) const;
  // A fresh block (one reference, appended to table) holding `b`'s bytes, registered under
  // b.hash when it has one; false (nothing taken) when no block is available. The caller has
  // checked b.bytes.size() == layout().block_bytes() (CHECKed). With windows the block gets a
  // held window page (holds).
  bool import_block(const KvBlock& b, std::vector<int32_t>* table,
                    std::vector<int32_t>* holds = nullptr);
  // import_block of bytes alone: the block is not registered. window: whether the block gets
  // (and holds) a window page for the bytes' window region (else they are dropped, or absent:
  // bytes of main_bytes(); a block the sequence will not read over a window).
  bool import_bytes(std::span<const uint8_t> bytes, std::vector<int32_t>* table,
                    std::vector<int32_t>* holds = nullptr, bool window = true);

 private:
  struct BlockInfo {
    int32_t refs = 0;
    std::optional<uint64_t> hash;  // set while registered in by_hash_
    uint64_t parent = 0;
    std::vector<int32_t> tokens;  // the registered block's tokens (collision check)
    std::list<int32_t>::iterator lru_pos;
    bool in_lru = false;
    int32_t window = -1;  // the window page, -1: none
    int32_t window_holds = 0;
    std::list<int32_t>::iterator window_lru_pos;
    bool in_window_lru = false;
  };

  uint8_t* block_ptr(int32_t block);
  const uint8_t* block_ptr(int32_t block) const;
  uint8_t* window_ptr(int32_t block);  // the block's window page (it has one)
  const uint8_t* window_ptr(int32_t block) const;
  // n fresh blocks, the last `windows` of them with held window pages.
  bool allocate_blocks(int32_t n, int32_t windows, std::vector<int32_t>* table,
                       std::vector<int32_t>* holds);
  void attach_window(int32_t block);  // a page for a block without one (one is available)
  void hold_window(int32_t block);
  void drop_window(int32_t block);
  void free_window(int32_t block);
  bool windows_present(std::span<const int32_t> blocks) const;
  uint8_t* latent_ptr(int64_t layer, std::span<const int32_t> table, int64_t pos);
  std::optional<int32_t> lookup(uint64_t hash, uint64_t parent,
                                std::span<const int32_t> tokens) const;
  void evict_one();
  void reap_loads();
  void take(int32_t block);
  bool add_to_index(int32_t block, uint64_t hash, uint64_t parent,
                    std::span<const int32_t> block_tokens);

  KvLayout layout_;
  std::vector<int64_t> latent_part_;  // per layer: its kLatent part's index, -1 for none
  uint64_t fingerprint_;
  KvTier* tier_ = nullptr;
  BlockAllocator allocator_;
  std::vector<BlockInfo> info_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::list<int32_t> lru_;     // unreferenced cached blocks, least recently used first
  std::vector<uint8_t> data_;  // [num_blocks][main_bytes]
  // The window pool: [window_pages][window_bytes]; each page's block (-1: free); free pages;
  // cached ones' blocks (registered, unheld), least recently used first.
  std::vector<uint8_t> window_data_;
  std::vector<int32_t> window_owner_;
  std::vector<int32_t> window_free_;
  std::list<int32_t> window_lru_;
  std::shared_ptr<KvLoadJob::Signal> load_signal_ = std::make_shared<KvLoadJob::Signal>();
  std::vector<std::shared_ptr<KvLoadJob>> loads_;  // started, not seen finished yet
  struct HeldBlocks {
    std::vector<int32_t> table, holds;
  };
  std::vector<std::pair<std::shared_ptr<KvLoadJob>, HeldBlocks>> release_later_;
};

}  // namespace moeserve
