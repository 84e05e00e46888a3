// KvCache: block ids, the prefix index, bytes and blocks as objects. Example tests, then a
// randomized test against a naive model of refcounts, LRU eviction and prefix lookup.
#include "cache/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "tier_test_util.h"

namespace moeserve {
namespace {

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = i * 7 + salt;
  return t;
}

KvCache make_cache(int32_t blocks, uint64_t fingerprint = 0) {
  // F32 tokens of 2 + 1 values.
  return KvCache({/*n_layers=*/2, {DType::kF32, /*kv_lora_rank=*/2, /*rope_dim=*/1}}, blocks,
                 fingerprint);
}

TEST(BlockAllocator, AllocatesAllThenRefuses) {
  BlockAllocator a(3);
  std::vector<int32_t> got;
  EXPECT_TRUE(a.allocate(3, &got));
  EXPECT_FALSE(a.allocate(1, &got));
  EXPECT_EQ(got.size(), 3u);
  a.free(got[1]);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(*a.allocate(), got[1]);
}

TEST(KvCache, PrefixIsReusedAndRefcounted) {
  KvCache m = make_cache(8);
  auto t = tokens(150, 1);  // two full blocks and a partial one
  std::vector<int32_t> table;
  ASSERT_TRUE(m.allocate(3, &table));
  std::vector<uint64_t> hashes = register_blocks(m, t, table, 2);
  EXPECT_EQ(m.cached_blocks(), 2);

  std::vector<int32_t> other;
  std::vector<uint64_t> other_hashes;
  EXPECT_EQ(m.acquire_prefix(t, 10, &other, &other_hashes), 2);
  EXPECT_EQ(other, std::vector<int32_t>(table.begin(), table.begin() + 2));
  EXPECT_EQ(other_hashes, hashes);
  EXPECT_EQ(m.refcount(table[0]), 2);
  // A prompt that differs inside block 1 reuses only block 0.
  auto u = t;
  u[100] += 1;
  std::vector<int32_t> third;
  std::vector<uint64_t> h3;
  EXPECT_EQ(m.acquire_prefix(u, 10, &third, &h3), 1);
  // max_blocks caps the reuse.
  std::vector<int32_t> capped;
  EXPECT_EQ(m.acquire_prefix(t, 1, &capped, &h3), 1);
  m.release(capped);
  m.release(third);
  m.release(other);
  m.release(table);
  // Registered blocks stay cached after release and count as available.
  EXPECT_EQ(m.num_available(), 8);
  EXPECT_EQ(m.cached_blocks(), 2);
  std::vector<int32_t> again;
  EXPECT_EQ(m.acquire_prefix(t, 10, &again, &h3), 2);
  m.release(again);
}

TEST(KvCache, EvictsUnreferencedCachedBlocksWhenFull) {
  KvCache m = make_cache(4);
  auto a = tokens(128, 1), b = tokens(128, 2);
  std::vector<int32_t> ta, tb;
  std::vector<uint64_t> h;
  ASSERT_TRUE(m.allocate(2, &ta));
  register_blocks(m, a, ta, 2);
  m.release(ta);
  ASSERT_TRUE(m.allocate(2, &tb));
  register_blocks(m, b, tb, 2);
  // b is referenced; a is cached but evictable. Taking 2 more blocks evicts a.
  std::vector<int32_t> tc;
  ASSERT_TRUE(m.allocate(2, &tc));
  EXPECT_FALSE(m.allocate(1, &tc));  // everything referenced now
  std::vector<int32_t> probe;
  EXPECT_EQ(m.acquire_prefix(a, 10, &probe, &h), 0);
  EXPECT_EQ(m.acquire_prefix(b, 10, &probe, &h), 2);
  m.release(probe);
  m.release(tb);
  m.release(tc);
  EXPECT_EQ(m.num_available(), 4);
}

TEST(KvCache, LruEvictsChainTailsFirst) {
  KvCache m = make_cache(3);
  auto a = tokens(192, 3);
  std::vector<int32_t> ta, one, probe;
  std::vector<uint64_t> h;
  ASSERT_TRUE(m.allocate(3, &ta));
  register_blocks(m, a, ta, 3);
  m.release(ta);
  ASSERT_TRUE(m.allocate(1, &one));  // evicts one block: the chain's last
  EXPECT_EQ(m.acquire_prefix(a, 10, &probe, &h), 2);
}

TEST(KvCache, DuplicateContentRegistersOnce) {
  KvCache m = make_cache(4);
  auto t = tokens(64, 5);
  std::vector<int32_t> x, y;
  ASSERT_TRUE(m.allocate(1, &x));
  ASSERT_TRUE(m.allocate(1, &y));
  register_blocks(m, t, x, 1);
  register_blocks(m, t, y, 1);  // same tokens computed twice concurrently
  EXPECT_EQ(m.cached_blocks(), 1);
  m.release(y);  // unregistered: goes straight back to the free list
  m.release(x);
  EXPECT_EQ(m.num_available(), 4);
}

// A block registers even when its predecessor was registered by another sequence's block (or
// imported): the chain hash comes from the tokens, not from local registration.
TEST(KvCache, RegistersAfterAPredecessorHeldElsewhere) {
  KvCache m = make_cache(4);
  auto t = tokens(128, 6);
  std::vector<int32_t> x, y, probe;
  std::vector<uint64_t> h;
  ASSERT_TRUE(m.allocate(1, &x));
  ASSERT_TRUE(m.allocate(2, &y));
  register_blocks(m, t, x, 1);  // block 0 under x
  register_blocks(m, t, y, 2);  // y's block 0 is a duplicate, its block 1 is new
  EXPECT_EQ(m.cached_blocks(), 2);
  EXPECT_EQ(m.acquire_prefix(t, 2, &probe, &h), 2);
  EXPECT_EQ(probe, (std::vector<int32_t>{x[0], y[1]}));
}

// The fingerprint seeds the chain: another model's cache never matches.
TEST(KvCache, FingerprintSeparatesModels) {
  KvCache a = make_cache(2, /*fingerprint=*/1), b = make_cache(2, /*fingerprint=*/2);
  auto t = tokens(64, 9);
  EXPECT_NE(a.chain_hash(a.fingerprint(), t), b.chain_hash(b.fingerprint(), t));
}

// A block's bytes for every layer are one contiguous object: layer l's token s of block b sits
// at ((b * n_layers + l) * 64 + s) * dim elements, and layer views step by block_stride_bytes().
TEST(KvCache, BlockMajorLayout) {
  KvCache c = make_cache(3);
  std::vector<int32_t> table = {2, 0};
  float v[3] = {1.5f, -2.0f, 3.25f};
  c.write(1, table, 65, v);  // table[1] = block 0, slot 1, layer 1
  const float* base = reinterpret_cast<const float*>(c.layer_base(1));
  EXPECT_EQ(c.block_stride_bytes(), 2 * 64 * 3 * 4);
  EXPECT_EQ(base[0 * c.block_stride_bytes() / 4 + 1 * 3 + 2], 3.25f);
  EXPECT_EQ(reinterpret_cast<const float*>(c.layer_base(0))[(1 * 64 + 1) * 3 + 2], 3.25f);
  float back[3];
  c.read(1, table, 65, back);
  EXPECT_EQ(std::vector<float>(back, back + 3), std::vector<float>(v, v + 3));
}

// An FP8 cache (FlashMLA's format): a token is kv_lora_rank e4m3 bytes, a scale per 128 of
// them and the BF16 rope key, at the block-major offset of its token bytes; write quantizes and
// read gives the dequantized values (kv_token_store / kv_token_load, tested in
// tests/kernels/kv_token_test.cpp).
TEST(KvCache, Fp8TokensAtTheirBlockMajorOffsets) {
  const KvLayout layout{/*n_layers=*/2, {DType::kF8E4M3, /*kv_lora_rank=*/128, /*rope_dim=*/3}};
  constexpr int64_t kTokenBytes = 128 + 4 + 3 * 2;
  EXPECT_EQ(layout.token_bytes(), size_t(kTokenBytes));
  EXPECT_EQ(layout.block_bytes(), size_t(2 * 64 * kTokenBytes));
  KvCache c(layout, 3);
  EXPECT_EQ(c.block_stride_bytes(), 2 * 64 * kTokenBytes);
  EXPECT_EQ(c.layer_base(1) - c.layer_base(0), 64 * kTokenBytes);
  std::vector<float> v(131);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(int(i % 7) - 3) * 0.37f + 0.01f * float(i);
  std::vector<int32_t> table = {2, 0};
  c.write(1, table, 65, v.data());  // table[1] = block 0, slot 1, layer 1
  std::vector<uint8_t> want(static_cast<size_t>(kTokenBytes));
  kv_token_store(layout.token, v.data(), want.data());
  const uint8_t* at = c.layer_base(1) + 0 * c.block_stride_bytes() + 1 * kTokenBytes;
  EXPECT_TRUE(std::equal(want.begin(), want.end(), at));
  std::vector<float> back(v.size()), deq(v.size());
  c.read(1, table, 65, back.data());
  kv_token_load(layout.token, want.data(), deq.data());
  EXPECT_EQ(back, deq);
  for (size_t i = 0; i < 128; ++i) EXPECT_NEAR(back[i], v[i], 2.5f / 16) << i;  // amax 2.5
  // The whole block as an object: export, import elsewhere, same bytes and values.
  KvCache dst(layout, 1);
  std::vector<int32_t> got;
  const KvBlock b = c.export_block(0);
  ASSERT_EQ(b.bytes.size(), layout.block_bytes());
  ASSERT_TRUE(dst.import_block(b, &got));
  EXPECT_EQ(dst.export_block(got[0]).bytes, b.bytes);
  std::vector<float> imported(v.size());
  dst.read(1, std::vector<int32_t>{0, got[0]}, 65, imported.data());
  EXPECT_EQ(imported, deq);
}

TEST(KvCache, ExportImportRoundTrip) {
  KvCache src = make_cache(2, 7), dst = make_cache(2, 7);
  auto t = tokens(64, 4);
  std::vector<int32_t> table;
  ASSERT_TRUE(src.allocate(1, &table));
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t p = 0; p < 64; ++p) {
      float v[3] = {float(l), float(p), float(l * 100 + p)};
      src.write(l, table, p, v);
    }
  }
  register_blocks(src, t, table, 1);
  KvBlock b = src.export_block(table[0]);
  ASSERT_TRUE(b.hash.has_value());
  EXPECT_EQ(b.bytes.size(), src.layout().block_bytes());
  EXPECT_EQ(b.tokens, t);
  std::vector<int32_t> got;
  ASSERT_TRUE(dst.import_block(b, &got));
  EXPECT_EQ(dst.export_block(got[0]), b);  // every field
  float v[3];
  dst.read(1, got, 5, v);
  EXPECT_EQ(v[2], 105.0f);
  dst.release(got);
  // The imported block is registered: a prompt with those tokens finds it.
  std::vector<int32_t> probe;
  std::vector<uint64_t> h;
  EXPECT_EQ(dst.acquire_prefix(t, 1, &probe, &h), 1);
  EXPECT_EQ(probe, got);
}

TEST(KvCache, TierReceivesEvictionsAndServesMisses) {
  KvCache c = make_cache(2);
  MapTier tier;
  c.set_tier(&tier);
  auto a = tokens(128, 1);
  std::vector<int32_t> ta, other, probe;
  std::vector<uint64_t> h;
  ASSERT_TRUE(c.allocate(2, &ta));
  float v[3] = {4, 5, 6};
  c.write(0, ta, 3, v);
  register_blocks(c, a, ta, 2);
  c.release(ta);
  ASSERT_TRUE(c.allocate(2, &other));  // evicts both into the tier
  EXPECT_EQ(tier.blocks.size(), 2u);
  EXPECT_EQ(c.cached_blocks(), 0);
  c.release(other);
  EXPECT_EQ(c.acquire_prefix(a, 2, &probe, &h), 0);      // not in RAM any more
  EXPECT_EQ(acquire_with_tier(c, a, 2, &probe, &h), 2);  // both come back from the tier
  float back[3];
  c.read(0, probe, 3, back);
  EXPECT_EQ(back[2], 6.0f);
  c.release(probe);
}

// Puts the first n full blocks of t into the tier (as a restarted process finds them).
void fill_tier(MapTier& tier, std::span<const int32_t> t, int n, float salt) {
  KvCache c = make_cache(8);
  tier.keep_registered = true;
  c.set_tier(&tier);
  std::vector<int32_t> table;
  ASSERT_TRUE(c.allocate(n, &table));
  for (int64_t p = 0; p < n * kKvBlockSize; ++p) {
    float v[3] = {salt, float(p), 0};
    c.write(1, table, p, v);
  }
  register_blocks(c, t, table, n);
  c.release(table);
  tier.keep_registered = false;
}

TEST(KvCache, ALoadReservesBlocksAndRegistersThemWhenItFinishes) {
  MapTier tier;
  auto t = tokens(200, 3);
  fill_tier(tier, t, 3, 9.0f);
  KvCache c = make_cache(5);
  c.set_tier(&tier);
  tier.hold = true;
  std::vector<int32_t> table;
  std::vector<uint64_t> hashes;
  ASSERT_EQ(c.acquire_prefix(t, 3, &table, &hashes), 0);
  auto job = c.start_load(t, 0, 3, c.fingerprint(), &table);
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(table.size(), 3u);
  EXPECT_EQ(c.num_available(), 2);
  EXPECT_FALSE(job->finished());
  EXPECT_EQ(c.loads_in_flight(), 1);
  tier.release_loads();
  c.wait_for_load();  // returns: a load has finished
  ASSERT_TRUE(job->finished());
  EXPECT_EQ(c.loads_in_flight(), 0);
  EXPECT_EQ(c.finish_load(*job, table, &hashes), 3);
  EXPECT_EQ(hashes.size(), 3u);
  float v[3];
  c.read(1, table, 130, v);
  EXPECT_EQ(v[0], 9.0f);
  EXPECT_EQ(v[1], 130.0f);
  // Registered: another sequence with the prompt finds them in RAM.
  std::vector<int32_t> other;
  std::vector<uint64_t> h2;
  EXPECT_EQ(c.acquire_prefix(t, 3, &other, &h2), 3);
  EXPECT_EQ(other, table);
  c.release(other);
  c.release(table);
}

TEST(KvCache, ALoadStopsAtTheFirstBlockTheTierLacks) {
  MapTier tier;
  auto t = tokens(200, 4);
  fill_tier(tier, t, 3, 1.0f);
  const uint64_t h0 = 0;  // make_cache's fingerprint
  KvCache probe = make_cache(1);
  const uint64_t h1 = probe.chain_hash(probe.chain_hash(h0, std::span<const int32_t>(t).first(64)),
                                       std::span<const int32_t>(t).subspan(64, 64));
  ASSERT_EQ(tier.blocks.erase(h1), 1u);  // the chain's second block
  ASSERT_EQ(tier.blocks.size(), 2u);
  KvCache c = make_cache(5);
  c.set_tier(&tier);
  std::vector<int32_t> table;
  std::vector<uint64_t> hashes;
  EXPECT_EQ(acquire_with_tier(c, t, 3, &table, &hashes), 1);
  EXPECT_EQ(table.size(), 3u);  // the two it did not fill stay the caller's, fresh
  EXPECT_TRUE(c.is_registered(table[0]));
  EXPECT_FALSE(c.is_registered(table[1]));
  EXPECT_FALSE(c.is_registered(table[2]));
  c.release(table);
  EXPECT_EQ(c.num_available(), 5);
}

TEST(KvCache, ATableReleasedWhileLoadingIsFreedWhenTheLoadFinishes) {
  MapTier tier;
  auto t = tokens(130, 5);
  fill_tier(tier, t, 2, 1.0f);
  KvCache c = make_cache(4);
  c.set_tier(&tier);
  tier.hold = true;
  std::vector<int32_t> table;
  auto job = c.start_load(t, 0, 2, c.fingerprint(), &table);
  ASSERT_NE(job, nullptr);
  c.release_after_load(job, table);  // the sequence went away; the tier still writes
  EXPECT_EQ(c.num_available(), 2);
  tier.release_loads();
  EXPECT_EQ(c.loads_in_flight(), 0);
  EXPECT_EQ(c.num_available(), 4);
  EXPECT_EQ(c.cached_blocks(), 0);  // nothing registered from an abandoned load
}

TEST(KvCache, NoLoadWithoutTheFirstBlockOrFreeBlocks) {
  MapTier tier;
  auto t = tokens(200, 6);
  fill_tier(tier, t, 3, 1.0f);
  KvCache c = make_cache(2);
  c.set_tier(&tier);
  std::vector<int32_t> table;
  EXPECT_EQ(c.start_load(t, 0, 3, c.fingerprint(), &table), nullptr);  // 3 blocks, 2 free
  auto u = tokens(200, 7);
  EXPECT_EQ(c.start_load(u, 0, 2, c.fingerprint(), &table), nullptr);  // not in the tier
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(c.num_available(), 2);
}

// Random operations on KvCache and on a naive model: a free stack, refcounts, an LRU list and
// a map from each registered block's whole token prefix to its block. Compared after every
// operation.
TEST(KvCache, MatchesNaiveModelUnderRandomOperations) {
  constexpr int32_t kBlocks = 12;
  struct Naive {
    std::vector<int32_t> free_stack, refs = std::vector<int32_t>(kBlocks, 0);
    std::vector<int32_t> lru;  // front = least recently used
    std::map<std::vector<int32_t>, int32_t> by_prefix;
    std::map<int32_t, std::vector<int32_t>> prefix_of;
    Naive() {
      for (int32_t b = kBlocks - 1; b >= 0; --b) free_stack.push_back(b);
    }
    int32_t available() const { return int32_t(free_stack.size() + lru.size()); }
    bool allocate(int32_t n, std::vector<int32_t>* t) {
      if (n > available()) return false;
      while (int32_t(free_stack.size()) < n) {
        int32_t b = lru.front();
        lru.erase(lru.begin());
        by_prefix.erase(prefix_of[b]);
        prefix_of.erase(b);
        free_stack.push_back(b);
      }
      for (int32_t k = 0; k < n; ++k) {
        t->push_back(free_stack.back());
        refs[size_t(free_stack.back())] = 1;
        free_stack.pop_back();
      }
      return true;
    }
    void release(const std::vector<int32_t>& t) {
      for (auto it = t.rbegin(); it != t.rend(); ++it) {
        if (--refs[size_t(*it)] > 0) continue;
        if (prefix_of.count(*it)) {
          lru.push_back(*it);
        } else {
          free_stack.push_back(*it);
        }
      }
    }
    void register_block(int32_t b, std::vector<int32_t> prefix) {
      if (prefix_of.count(b) || by_prefix.count(prefix)) return;
      by_prefix[prefix] = b;
      prefix_of[b] = std::move(prefix);
    }
    int32_t acquire(const std::vector<int32_t>& t, int32_t max_blocks, std::vector<int32_t>* out) {
      int32_t n = 0;
      while (n < max_blocks && (n + 1) * kKvBlockSize <= int64_t(t.size())) {
        auto it = by_prefix.find({t.begin(), t.begin() + (n + 1) * kKvBlockSize});
        if (it == by_prefix.end()) break;
        lru.erase(std::remove(lru.begin(), lru.end(), it->second), lru.end());
        ++refs[size_t(it->second)];
        out->push_back(it->second);
        ++n;
      }
      return n;
    }
  };
  std::mt19937 rng(1234);
  int hits = 0, evictions_seen = 0;
  for (int round = 0; round < 20; ++round) {
    KvCache real = make_cache(kBlocks, /*fingerprint=*/uint64_t(round));
    Naive naive;
    // Prompts share prefixes: a base prompt with its tail changed from a random block on.
    std::vector<std::vector<int32_t>> bases = {tokens(256, 1), tokens(256, 2)};
    struct Seq {
      std::vector<int32_t> t, real_table, naive_table;
      int registered = 0;
    };
    std::vector<Seq> live;
    for (int op = 0; op < 300; ++op) {
      const int kind = int(rng() % 4);
      if (kind == 0 || live.empty()) {  // admit: prefix lookup, then blocks for the rest
        Seq s;
        s.t = bases[rng() % 2];
        const size_t cut = size_t(rng() % 5) * kKvBlockSize;
        for (size_t i = cut; i < s.t.size(); ++i) s.t[i] += 1000 + int32_t(rng() % 3);
        s.t.resize(size_t(64 + rng() % 192));
        const int32_t max_blocks = int32_t(rng() % 5);
        std::vector<uint64_t> h;
        const int32_t cached_before = real.cached_blocks();
        int32_t hr = real.acquire_prefix(s.t, max_blocks, &s.real_table, &h);
        int32_t hn = naive.acquire(s.t, max_blocks, &s.naive_table);
        ASSERT_EQ(hr, hn) << "round " << round << " op " << op;
        ASSERT_EQ(s.real_table, s.naive_table);
        hits += hr;
        s.registered = hr;
        const int32_t need = blocks_for(int64_t(s.t.size())) - hr;
        bool ok_real = real.allocate(need, &s.real_table);
        bool ok_naive = naive.allocate(need, &s.naive_table);
        ASSERT_EQ(ok_real, ok_naive);
        ASSERT_EQ(s.real_table, s.naive_table);
        evictions_seen += real.cached_blocks() < cached_before;
        if (!ok_real) {
          real.release(s.real_table);
          naive.release(s.naive_table);
        } else {
          live.push_back(std::move(s));
        }
      } else if (kind == 1 || kind == 2) {  // a block of a live sequence becomes final
        Seq& s = live[rng() % live.size()];
        if (s.registered >= int(s.t.size() / kKvBlockSize)) continue;
        const int b = s.registered++;
        register_blocks(real, s.t, s.real_table, b + 1);  // 0..b-1 again: mostly no-ops
        for (int k = 0; k <= b; ++k) {
          naive.register_block(s.naive_table[size_t(k)],
                               {s.t.begin(), s.t.begin() + (k + 1) * kKvBlockSize});
        }
      } else {  // finish
        size_t i = rng() % live.size();
        real.release(live[i].real_table);
        naive.release(live[i].naive_table);
        live.erase(live.begin() + std::ptrdiff_t(i));
      }
      ASSERT_EQ(real.num_available(), naive.available()) << "round " << round << " op " << op;
      ASSERT_EQ(real.cached_blocks(), int32_t(naive.by_prefix.size()));
      for (int32_t b = 0; b < kBlocks; ++b) {
        ASSERT_EQ(real.refcount(b), naive.refs[size_t(b)]) << "block " << b;
        ASSERT_EQ(real.is_registered(b), naive.prefix_of.count(b) == 1) << "block " << b;
      }
    }
  }
  // The sequence exercised what it is meant to: prefix hits and evictions.
  EXPECT_GT(hits, 100);
  EXPECT_GT(evictions_seen, 10);
}

}  // namespace
}  // namespace moeserve
