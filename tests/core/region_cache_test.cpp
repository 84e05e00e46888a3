// Recycled huge-page regions (core/region_cache.h): aligned, rounded, reused after a free, and
// the hand-off bytes built on them (KvBytes) behave as a vector.
#include "core/region_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "engine/handoff.h"

namespace moeserve {
namespace {

TEST(RegionCache, AlignedAndReusedAfterAFree) {
  void* a = region_alloc(5 << 20);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kRegionAlign, 0u);
  std::memset(a, 1, 5 << 20);  // the whole rounded size is usable
  region_free(a, 5 << 20);
  void* b = region_alloc((5 << 20) + 100);  // rounds to the same 6 MiB: the region comes back
  EXPECT_EQ(a, b);
  void* c = region_alloc(5 << 20);  // none free of that size now: a fresh one
  EXPECT_NE(c, b);
  region_free(b, 5 << 20);
  region_free(c, 5 << 20);
}

TEST(RegionCache, KvBytesHoldWhatIsWritten) {
  KvBytes small(1000), big(3 << 20);
  for (size_t i = 0; i < small.size(); ++i) small[i] = uint8_t(i);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 7);
  KvBytes copy = big;
  EXPECT_EQ(copy, big);
  EXPECT_EQ(small[999], uint8_t(999));
  KvBytes moved = std::move(copy);
  EXPECT_EQ(moved[12345], uint8_t(12345 * 7));
}

}  // namespace
}  // namespace moeserve
