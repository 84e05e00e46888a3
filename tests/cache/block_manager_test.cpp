#include "cache/block_manager.h"

#include <gtest/gtest.h>

#include <numeric>

namespace moeserve {
namespace {

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = i * 7 + salt;
  return t;
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

TEST(KvBlockManager, PrefixIsReusedAndRefcounted) {
  KvBlockManager m(8);
  auto t = tokens(150, 1);  // two full blocks and a partial one
  std::vector<int32_t> table;
  ASSERT_TRUE(m.allocate(3, &table));
  m.register_full_block(t, table, 0);
  m.register_full_block(t, table, 1);
  EXPECT_EQ(m.cached_blocks(), 2);

  std::vector<int32_t> other;
  EXPECT_EQ(m.acquire_prefix(t, 10, &other), 2);
  EXPECT_EQ(other, std::vector<int32_t>(table.begin(), table.begin() + 2));
  EXPECT_EQ(m.refcount(table[0]), 2);
  // A prompt that differs inside block 1 reuses only block 0.
  auto u = t;
  u[100] += 1;
  std::vector<int32_t> third;
  EXPECT_EQ(m.acquire_prefix(u, 10, &third), 1);
  // max_blocks caps the reuse.
  std::vector<int32_t> capped;
  EXPECT_EQ(m.acquire_prefix(t, 1, &capped), 1);
  m.release(capped);
  m.release(third);
  m.release(other);
  m.release(table);
  // Registered blocks stay cached after release and count as available.
  EXPECT_EQ(m.num_available(), 8);
  EXPECT_EQ(m.cached_blocks(), 2);
  std::vector<int32_t> again;
  EXPECT_EQ(m.acquire_prefix(t, 10, &again), 2);
  m.release(again);
}

TEST(KvBlockManager, EvictsUnreferencedCachedBlocksWhenFull) {
  KvBlockManager m(4);
  auto a = tokens(128, 1), b = tokens(128, 2);
  std::vector<int32_t> ta, tb;
  ASSERT_TRUE(m.allocate(2, &ta));
  m.register_full_block(a, ta, 0);
  m.register_full_block(a, ta, 1);
  m.release(ta);
  ASSERT_TRUE(m.allocate(2, &tb));
  m.register_full_block(b, tb, 0);
  m.register_full_block(b, tb, 1);
  // b is referenced; a is cached but evictable. Taking 2 more blocks evicts a.
  std::vector<int32_t> tc;
  ASSERT_TRUE(m.allocate(2, &tc));
  EXPECT_FALSE(m.allocate(1, &tc));  // everything referenced now
  std::vector<int32_t> probe;
  EXPECT_EQ(m.acquire_prefix(a, 10, &probe), 0);
  EXPECT_EQ(m.acquire_prefix(b, 10, &probe), 2);
  m.release(probe);
  m.release(tb);
  m.release(tc);
  EXPECT_EQ(m.num_available(), 4);
}

TEST(KvBlockManager, LruEvictsChainTailsFirst) {
  KvBlockManager m(3);
  auto a = tokens(192, 3);
  std::vector<int32_t> ta;
  ASSERT_TRUE(m.allocate(3, &ta));
  for (int i = 0; i < 3; ++i) m.register_full_block(a, ta, i);
  m.release(ta);
  std::vector<int32_t> one;
  ASSERT_TRUE(m.allocate(1, &one));  // evicts one block: the chain's last
  std::vector<int32_t> probe;
  EXPECT_EQ(m.acquire_prefix(a, 10, &probe), 2);
}

TEST(KvBlockManager, DuplicateContentRegistersOnce) {
  KvBlockManager m(4);
  auto t = tokens(64, 5);
  std::vector<int32_t> x, y;
  ASSERT_TRUE(m.allocate(1, &x));
  ASSERT_TRUE(m.allocate(1, &y));
  m.register_full_block(t, x, 0);
  m.register_full_block(t, y, 0);  // same tokens computed twice concurrently
  EXPECT_EQ(m.cached_blocks(), 1);
  m.release(y);  // unregistered: goes straight back to the free list
  m.release(x);
  EXPECT_EQ(m.num_available(), 4);
}

}  // namespace
}  // namespace moeserve
