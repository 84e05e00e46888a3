// RowPool / RowVector (ep/row_pool.h): the storage of a dispatched batch's rows goes back to the
// dispatcher's pool when the batch dies and the next batch reuses it, whatever copies and moves
// happened in between; the pool keeps only its largest idle blocks.
#include "ep/row_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "ep/dispatcher.h"

namespace moeserve {
namespace {

TEST(RowPool, ABatchDroppedAfterUseGivesItsRowsToTheNextOne) {
  auto pool = std::make_shared<RowPool>();
  const uint16_t* first = nullptr;
  for (int call = 0; call < 5; ++call) {
    RowVector<uint16_t> rows{RowAllocator<uint16_t>(pool)};
    rows.resize(size_t(1000 + 10 * call));  // a little more each call: within the headroom
    rows.back() = 7;
    if (call == 0) first = rows.data();
    EXPECT_EQ(rows.data(), first) << "call " << call;
    EXPECT_EQ(pool->idle_blocks(), 0u);
  }
  EXPECT_EQ(pool->idle_blocks(), 1u);
  EXPECT_EQ(pool->blocks_allocated(), 1u);
}

TEST(RowPool, StorageFollowsMovesAndCopiesBackToItsPool) {
  auto pool = std::make_shared<RowPool>();
  {
    ExpertBatch kept;  // default: no pool
    {
      ExpertBatch made;
      made.x = RowVector<float>(RowAllocator<float>(pool));
      made.x.assign(64, 1.5f);
      kept = std::move(made);  // the caller's `b = std::move(*dispatched)`
    }
    EXPECT_EQ(kept.x.get_allocator().pool(), pool);
    ExpertBatch copy = kept;  // a copy draws from, and returns to, the same pool
    EXPECT_EQ(copy.x, kept.x);
    EXPECT_EQ(pool->blocks_allocated(), 2u);
  }
  EXPECT_EQ(pool->idle_blocks(), 2u);
  RowVector<float> again{RowAllocator<float>(pool)};
  again.resize(64);
  EXPECT_EQ(pool->blocks_allocated(), 2u) << "reused an idle block";
}

TEST(RowPool, KeepsTheLargestIdleBlocksAndTakesTheSmallestThatFits) {
  auto pool = std::make_shared<RowPool>(2);
  void* small = RowPool::take(pool.get(), 100);
  void* mid = RowPool::take(pool.get(), 1000);
  void* big = RowPool::take(pool.get(), 10000);
  RowPool::give(pool.get(), mid);
  RowPool::give(pool.get(), small);
  RowPool::give(pool.get(), big);  // over max_free: the smallest idle one (small) goes
  EXPECT_EQ(pool->idle_blocks(), 2u);
  EXPECT_EQ(RowPool::take(pool.get(), 50), mid) << "smallest idle block that fits";
  EXPECT_EQ(RowPool::take(pool.get(), 5000), big);
  void* fresh = RowPool::take(pool.get(), 20000);  // nothing idle fits
  EXPECT_EQ(pool->blocks_allocated(), 4u);
  RowPool::give(pool.get(), mid);
  RowPool::give(pool.get(), big);
  RowPool::give(nullptr, fresh);  // no pool: freed
  EXPECT_EQ(pool->idle_blocks(), 2u);
}

TEST(RowPool, BlocksAre64ByteAlignedWithOrWithoutAPool) {
  auto pool = std::make_shared<RowPool>();
  for (RowPool* p : {pool.get(), static_cast<RowPool*>(nullptr)}) {
    void* b = RowPool::take(p, 333);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
    RowPool::give(p, b);
  }
}

}  // namespace
}  // namespace moeserve
