// KvCache's window pool (docs/kv-cache.md, "The window pool"): a layout with sliding windows
// keeps each block's window region in a page of a second pool; sequences hold the pages of the
// blocks they still read over a window, cached pages of registered blocks make later prompts
// resume, and a prefix hit or a load ends only where the pages it needs are there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "cache/kv_cache.h"
#include "tier_test_util.h"

namespace moeserve {
namespace {

// Two layers of V4's kinds at small widths: both keep a windowed latent (window 128: the two
// blocks before a boundary) and a compressed part, the first also a state record (in the window
// region: only a step starting right after its block reads it).
KvLayout windowed_layout() {
  const KvTokenFormat f32{DType::kF32, 6, 2};
  return KvLayout({{{KvPart::latent(f32), KvPart::compressed(f32, 4), KvPart::state(24)}, 128},
                   {{KvPart::compressed(f32, 128), KvPart::latent(f32)}, 128}});
}

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = i * 5 + salt;
  return t;
}

// A value that says which position and layer it was written for.
float mark(int64_t layer, int64_t pos) {
  return float(pos * 10 + layer);
}

void write_positions(KvCache& c, std::span<const int32_t> table, int64_t from, int64_t to) {
  std::vector<float> v(size_t(c.dim()));
  for (int64_t l = 0; l < c.n_layers(); ++l) {
    for (int64_t p = from; p < to; ++p) {
      std::fill(v.begin(), v.end(), mark(l, p));
      c.write(l, table, p, v.data());
    }
  }
}

bool reads_back(const KvCache& c, std::span<const int32_t> table, int64_t from, int64_t to) {
  std::vector<float> v(size_t(c.dim()));
  for (int64_t l = 0; l < c.n_layers(); ++l) {
    for (int64_t p = from; p < to; ++p) {
      c.read(l, table, p, v.data());
      if (!std::all_of(v.begin(), v.end(), [&](float x) { return x == mark(l, p); })) return false;
    }
  }
  return true;
}

TEST(KvWindow, LayoutPutsTheWindowRegionLast) {
  const KvLayout l = windowed_layout();
  EXPECT_EQ(l.window(), 128);
  EXPECT_EQ(l.window_blocks(), 2);
  // The window region: both layers' window entries and the state record.
  EXPECT_EQ(l.window_bytes(), size_t(2 * 64 * 8 * 4 + 24));
  EXPECT_EQ(l.main_bytes(), size_t(16 * 8 * 4 + 8 * 4));
  EXPECT_EQ(l.main_bytes() + l.window_bytes(), l.block_bytes());
  EXPECT_TRUE(l.windowed(0, 0) && l.windowed(0, 2) && l.windowed(1, 1));
  EXPECT_FALSE(l.windowed(0, 1) || l.windowed(1, 0));
  EXPECT_EQ(l.part_offset(0, 1), 0u);
  EXPECT_EQ(l.part_offset(1, 0), size_t(16 * 8 * 4));
  EXPECT_EQ(l.part_offset(0, 0), l.main_bytes());
  EXPECT_EQ(l.part_offset(0, 2), l.main_bytes() + 64 * 8 * 4);
  EXPECT_EQ(l.part_offset(1, 1), l.main_bytes() + 64 * 8 * 4 + 24);
  // Without windows nothing moves: V2/V3's bytes.
  const KvLayout v3(2, KvTokenFormat{DType::kBF16, 512, 64});
  EXPECT_EQ(v3.main_bytes(), v3.block_bytes());
  EXPECT_EQ(v3.window_blocks(), 0);
  // A window of w reads w - 1 positions before a boundary: 64 and 65 one block, 66 two; 1 (the
  // token alone) none.
  for (auto [w, k] : {std::pair{64, 1}, {65, 1}, {66, 2}, {1, 0}, {256, 4}}) {
    const KvLayout one({{{KvPart::latent(KvTokenFormat{DType::kF32, 6, 2})}, w}});
    EXPECT_EQ(one.window_blocks(), k) << w;
  }
}

// A sequence of 5 blocks at position 300 holds pages for blocks 2-4 only; the others went back
// (unregistered: freed) or stay cached (registered); the entries it reads are intact.
TEST(KvWindow, PagesGoOnceTheirBlocksFallBehindTheWindow) {
  KvCache c(windowed_layout(), 16, 0, /*window_pages=*/8);
  ASSERT_TRUE(c.windowed());
  std::vector<int32_t> table, holds;
  ASSERT_TRUE(c.allocate(5, &table, &holds));
  EXPECT_EQ(holds, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(c.num_windows_available(), 3);
  write_positions(c, table, 0, 300);
  auto t = tokens(300, 3);
  register_blocks(c, t, table, 1);  // block 0 registered, block 1 not
  // Position 300's window reaches back to 173: block 2 (128-191) on.
  EXPECT_EQ(c.window_trim_point(300), 2);
  EXPECT_EQ(c.window_trim_point(255), 2);
  EXPECT_EQ(c.window_trim_point(254), 1);
  EXPECT_EQ(c.window_trim_point(100), 0);
  c.release_windows(table, &holds, c.window_trim_point(300));
  EXPECT_EQ(holds, (std::vector<int32_t>{2, 3, 4}));
  EXPECT_TRUE(c.has_window(table[0]));  // cached: registered
  EXPECT_EQ(c.window_holds(table[0]), 0);
  EXPECT_FALSE(c.has_window(table[1]));  // freed
  EXPECT_EQ(c.num_windows_available(), 5);
  EXPECT_TRUE(reads_back(c, table, 128, 300));
  // The main region stays whole: a block without its page still exports its other parts.
  const KvBlock b1 = c.export_block(table[1]);
  ASSERT_EQ(b1.bytes.size(), c.layout().block_bytes());
  EXPECT_TRUE(std::all_of(b1.bytes.begin() + std::ptrdiff_t(c.layout().main_bytes()),
                          b1.bytes.end(), [](uint8_t x) { return x == 0; }));
  c.release(table, holds);
  EXPECT_EQ(c.num_windows_available(), 8);
  EXPECT_EQ(c.num_available(), 16);
}

// Cached pages let a later prompt resume right after a registered block; once the pages of the
// blocks before the prompt's end are evicted, the hit ends at the last boundary that still has
// them.
TEST(KvWindow, APrefixHitEndsWhereThePagesBeforeItAre) {
  KvCache c(windowed_layout(), 16, 0, /*window_pages=*/6);
  auto t = tokens(4 * 64 + 10, 7);
  std::vector<int32_t> table, holds;
  ASSERT_TRUE(c.allocate(5, &table, &holds));
  write_positions(c, table, 0, int64_t(t.size()));
  register_blocks(c, t, table, 4);
  c.release_windows(table, &holds, c.window_trim_point(int64_t(t.size())));  // blocks 0, 1
  c.release(table, holds);  // window LRU, oldest first: blocks 0, 1, 2, 3 (4 freed)
  EXPECT_EQ(c.num_windows_available(), 6);

  // Three blocks of the prompt: blocks 1 and 2's pages are there; held now.
  std::vector<int32_t> t3, h3;
  std::vector<uint64_t> hashes;
  EXPECT_EQ(c.acquire_prefix(t, 3, &t3, &hashes, &h3), 3);
  EXPECT_EQ(h3, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(c.window_holds(table[1]), 1);
  EXPECT_TRUE(reads_back(c, t3, 65, 192));
  // Four fresh blocks take the 2 free pages and evict the cached ones of blocks 0 and 3.
  std::vector<int32_t> other, other_holds;
  ASSERT_TRUE(c.allocate(4, &other, &other_holds));
  EXPECT_FALSE(c.has_window(table[0]));
  EXPECT_FALSE(c.has_window(table[3]));
  EXPECT_EQ(c.num_windows_available(), 0);
  std::vector<int32_t> more, more_holds;
  EXPECT_FALSE(c.allocate(1, &more, &more_holds));  // no page: nothing taken
  EXPECT_TRUE(more.empty() && more_holds.empty());
  c.release(other, other_holds);
  c.release(t3, h3);

  // The whole prompt: block 3's page is gone, so the hit ends after block 2 (pages of 1, 2).
  std::vector<int32_t> t4, h4;
  hashes.clear();
  EXPECT_EQ(c.acquire_prefix(t, 4, &t4, &hashes, &h4), 3);
  EXPECT_EQ(hashes.size(), 3u);
  EXPECT_EQ(c.refcount(table[3]), 0);  // not taken
  c.release(t4, h4);
  // A prompt of two blocks needs blocks 0 and 1's pages: 0's went, 1 block is no hit either
  // (it needs block 0's), so nothing.
  std::vector<int32_t> t2, h2;
  hashes.clear();
  EXPECT_EQ(c.acquire_prefix(t, 2, &t2, &hashes, &h2), 0);
  EXPECT_TRUE(t2.empty() && h2.empty());
}

// Blocks as objects carry the window region: imported with a page it reads back; without one
// (behind every window) the main region alone arrives.
TEST(KvWindow, ExportAndImportCarryTheWindowRegion) {
  KvCache a(windowed_layout(), 4, 0, 4);
  std::vector<int32_t> table, holds;
  ASSERT_TRUE(a.allocate(2, &table, &holds));
  write_positions(a, table, 0, 128);
  std::memset(a.block_entry(0, 2, table[1], 0), 0x5a, 24);
  std::memset(a.block_entry(0, 1, table[1], 3), 0x3c, 32);  // a compressed entry (main region)
  const KvBlock b = a.export_block(table[1]);
  KvCache c(windowed_layout(), 4, 0, 2);
  std::vector<int32_t> t2, h2;
  ASSERT_TRUE(c.import_bytes(a.export_block(table[0]).bytes, &t2, &h2, /*window=*/false));
  ASSERT_TRUE(c.import_bytes(b.bytes, &t2, &h2));
  EXPECT_EQ(h2, (std::vector<int32_t>{1}));
  EXPECT_FALSE(c.has_window(t2[0]));
  EXPECT_EQ(c.num_windows_available(), 1);
  EXPECT_TRUE(reads_back(c, t2, 64, 128));
  EXPECT_EQ(c.export_block(t2[1]).bytes, b.bytes);
  const uint8_t* state = c.block_entry(0, 2, t2[1], 0);
  EXPECT_TRUE(std::all_of(state, state + 24, [](uint8_t x) { return x == 0x5a; }));
  const uint8_t* entry = c.part_base(0, 1) + size_t(t2[1]) * size_t(c.block_stride_bytes()) + 96;
  EXPECT_TRUE(std::all_of(entry, entry + 32, [](uint8_t x) { return x == 0x3c; }));
  // Block 0's main region arrived, its window region did not.
  const KvBlock b0 = c.export_block(t2[0]);
  const KvBlock a0 = a.export_block(table[0]);
  EXPECT_TRUE(std::equal(b0.bytes.begin(),
                         b0.bytes.begin() + std::ptrdiff_t(c.layout().main_bytes()),
                         a0.bytes.begin()));
}

// A load from the tier gives pages only to the blocks the resuming sequence reads over its
// window (the last two); when it stops short of them nothing is usable, and the window region of
// a block registered without its page never reaches the tier.
TEST(KvWindow, ALoadGivesPagesToTheBlocksBeforeItsEnd) {
  MapTier tier;
  tier.keep_registered = true;
  auto t = tokens(6 * 64 + 5, 11);
  {
    KvCache w(windowed_layout(), 16, 0, 8);
    w.set_tier(&tier);
    std::vector<int32_t> table, holds;
    ASSERT_TRUE(w.allocate(7, &table, &holds));
    write_positions(w, table, 0, int64_t(t.size()));
    register_blocks(w, t, table, 6);
    w.release(table, holds);
  }
  ASSERT_EQ(tier.blocks.size(), 6u);
  KvCache c(windowed_layout(), 16, 0, 4);
  c.set_tier(&tier);
  std::vector<int32_t> table, holds;
  std::vector<uint64_t> hashes;
  ASSERT_EQ(c.acquire_prefix(t, 6, &table, &hashes, &holds), 0);
  auto job = c.start_load(t, 0, 6, c.fingerprint(), &table, &holds);
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(holds, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(c.num_windows_available(), 2);
  while (!job->finished()) c.wait_for_load();
  EXPECT_EQ(c.finish_load(*job, table, &hashes), 6);
  EXPECT_TRUE(reads_back(c, table, 6 * 64 - 127, 6 * 64));
  c.release(table, holds);

  // A tier missing block 3: the load stops at 3 blocks, short of the pages (blocks 4, 5).
  KvCache d(windowed_layout(), 16, 0, 4);
  d.set_tier(&tier);
  uint64_t parent = d.fingerprint();
  for (int b = 0; b < 4; ++b)
    parent = d.chain_hash(parent, std::span(t).subspan(size_t(b) * 64, 64));
  tier.blocks.erase(parent);
  std::vector<int32_t> dt, dh;
  std::vector<uint64_t> dhashes;
  auto partial = d.start_load(t, 0, 6, d.fingerprint(), &dt, &dh);
  ASSERT_NE(partial, nullptr);
  while (!partial->finished()) d.wait_for_load();
  EXPECT_EQ(partial->n_loaded(), 3);
  EXPECT_EQ(d.finish_load(*partial, dt, &dhashes), 0);
  EXPECT_TRUE(dhashes.empty());
  EXPECT_EQ(d.cached_blocks(), 0);
  d.release(dt, dh);
  EXPECT_EQ(d.num_available(), 16);
  EXPECT_EQ(d.num_windows_available(), 4);
}

}  // namespace
}  // namespace moeserve
