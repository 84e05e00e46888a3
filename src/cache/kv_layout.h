// KvLayout: what a block of the paged KV cache holds, layer by layer (docs/kv-cache.md,
// "Layouts"). A block covers kKvBlockSize (64) consecutive positions of one sequence in every
// layer, block-major: [block][layer][part][entry][entry bytes]. Each layer lists its parts,
// each one kind of entry the layer's attention keeps:
//
//   kLatent      one per token: MLA's latent (kv_lora_rank normalised values, then rope_dim
//                rotated rope-key values) in a KvTokenFormat (F32, BF16 or FlashMLA's FP8).
//                V2/V3 keep only this; V4's sliding-window entries are these, read back over the
//                layer's window only.
//   kIndexKey    one per token or per compressed group: the lightning indexer's key, index_dim
//                FP8 e4m3 values and one F32 power-of-two scale (V3.2), index_dim FP4 e2m1
//                values with a UE8M0 exponent per 32 (V4's compressed sparse attention over its
//                4-token groups, kernels/index_fp4.h), or index_dim F32 values (either, in an
//                F32 cache: the reference formats).
//   kCompressed  one per `ratio` tokens (V4: 4 for compressed sparse, 128 for heavily compressed
//                attention): a compressed KV entry in a KvTokenFormat, written by the block that
//                completes the group.
//   kState       one record per block: the compressor's state after the block's last token,
//                for a group the block leaves unfinished (V4), so that a block is all a prefix
//                hit needs.
//
// A block is one object whatever its parts (export, disk tier, PD and EP hand-off move
// block_bytes() at a time), and the prefix cache's hash chain does not depend on them: a block
// registered under a prompt's tokens holds every part of every layer for them. In a layout
// with sliding windows (V4) the parts only a step near the block reads come last, after every
// other part of every layer: the windowed layers' kLatent entries (read over the window) and
// the kState records (read by a step starting right after the block). So a block is [main:
// layer by layer, the other parts][window: layer by layer, those], and the cache keeps the
// window region in a pool of its own, letting go of it once the block falls behind every
// window (docs/kv-cache.md, "The window pool"). V2/V3's
// layout, every layer one kLatent part and no window, has the bytes of kKvLayoutVersion 2 (one
// token's latent after another, layer after layer).
//
// Plain values; any thread may read them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "kernels/kv_token.h"

namespace moeserve {

inline constexpr int64_t kKvBlockSize = 64;

enum class KvPartKind : uint8_t { kLatent, kIndexKey, kCompressed, kState };
const char* kv_part_kind_name(KvPartKind k);

struct KvPart {
  KvPartKind kind = KvPartKind::kLatent;
  KvTokenFormat token;    // kLatent, kCompressed: the entry's format
  int64_t index_dim = 0;  // kIndexKey: values per key
  // kIndexKey: kF8E4M3 (index_dim e4m3 bytes, then one F32 scale), kF4E2M1
  // (fp4_index_key_bytes(index_dim)) or kF32 (index_dim values).
  DType index_dtype = DType::kF8E4M3;
  int64_t ratio = 1;        // kIndexKey, kCompressed: tokens per entry (1: one per token)
  int64_t state_bytes = 0;  // kState: bytes of the record

  static KvPart latent(KvTokenFormat token) {
    KvPart p;
    p.token = token;
    return p;
  }
  static KvPart index_key(int64_t dim, int64_t ratio = 1, DType dtype = DType::kF8E4M3) {
    KvPart p;
    p.kind = KvPartKind::kIndexKey;
    p.index_dim = dim;
    p.index_dtype = dtype;
    p.ratio = ratio;
    return p;
  }
  static KvPart compressed(KvTokenFormat token, int64_t ratio) {
    KvPart p;
    p.kind = KvPartKind::kCompressed;
    p.token = token;
    p.ratio = ratio;
    return p;
  }
  static KvPart state(int64_t bytes) {
    KvPart p;
    p.kind = KvPartKind::kState;
    p.state_bytes = bytes;
    return p;
  }

  // Entries per block: kKvBlockSize / ratio, at least one (a group longer than a block has its
  // entry in the block that completes it); one state record.
  int64_t entries() const;
  int64_t entry_bytes() const;
  int64_t bytes() const { return entries() * entry_bytes(); }
  friend bool operator==(const KvPart&, const KvPart&) = default;
};

struct KvLayerFormat {
  std::vector<KvPart> parts;
  // Positions back from the newest that attention reads this layer's per-token entries over
  // (V4's sliding window: 128); 0: all of them.
  int64_t window = 0;

  int64_t bytes() const;  // of one block
  friend bool operator==(const KvLayerFormat&, const KvLayerFormat&) = default;
};

struct KvLayout {
  KvLayout() = default;
  // Every layer keeps MLA's latent per token, as `token` (V2/V3, and their MTP layer).
  KvLayout(int64_t n_layers, KvTokenFormat token);
  // Any mix; every kLatent part has the same format (`token` below).
  explicit KvLayout(std::vector<KvLayerFormat> layers);

  // Derived, for the readers of the latent: the number of layers and the format of every
  // layer's kLatent part (default when none has one).
  int64_t n_layers = 0;
  KvTokenFormat token;

  const std::vector<KvLayerFormat>& layers() const { return layers_; }
  const KvLayerFormat& layer(int64_t l) const { return layers_[size_t(l)]; }
  // Bytes of one latent token (token.bytes()).
  size_t token_bytes() const { return size_t(token.bytes()); }
  size_t block_bytes() const { return block_bytes_; }
  // Offset of layer l's part p (an index into layer(l).parts) within a block.
  size_t part_offset(int64_t l, size_t p) const { return part_offset_[size_t(l)][p]; }
  // Whether layer l's part p is in the window region (a windowed layer's kLatent; with any
  // window, a kState record).
  bool windowed(int64_t l, size_t p) const;
  // The window region: bytes [main_bytes(), block_bytes()) of a block; empty when no layer has
  // a window.
  size_t main_bytes() const { return main_bytes_; }
  size_t window_bytes() const { return block_bytes_ - main_bytes_; }
  // The longest window of any layer (0: none), and the blocks before a block boundary whose
  // window regions a sequence resuming there reads: ceil((window - 1) / kKvBlockSize).
  int64_t window() const { return window_; }
  int32_t window_blocks() const;
  // The index of layer l's first part of `kind`, or -1 when it has none.
  int64_t find_part(int64_t l, KvPartKind kind) const;
  friend bool operator==(const KvLayout& a, const KvLayout& b) { return a.layers_ == b.layers_; }

 private:
  void index();
  std::vector<KvLayerFormat> layers_;
  std::vector<std::vector<size_t>> part_offset_;  // [layer][part]
  size_t main_bytes_ = 0, block_bytes_ = 0;
  int64_t window_ = 0;
};

// Ok, or InvalidArgument saying which layer's part cannot be stored and why (an FP8 latent
// needs kv_lora_rank % 128 == 0; a compressed group of more than a block must be a multiple of
// it, of less a divisor; an index key needs a positive dim).
Status kv_layout_status(const KvLayout& layout);

}  // namespace moeserve
