#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace moeserve {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 3, 7, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    for (int rep = 0; rep < 20; ++rep) {
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
    }
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 20) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, TwoPoolsCoexist) {
  ThreadPool a(2), b(2);
  std::atomic<int64_t> sum{0};
  a.parallel_for(100, [&](int64_t s, int64_t e) { sum += e - s; });
  b.parallel_for(50, [&](int64_t s, int64_t e) { sum += e - s; });
  EXPECT_EQ(sum.load(), 150);
}

}  // namespace
}  // namespace moeserve
