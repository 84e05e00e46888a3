// torch_order: the tie rules that make plans match eplb.py (docs/eplb.md, "Tie-breaking").
#include "eplb/torch_order.h"

#include <algorithm>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace moeserve::eplb {
namespace {

std::vector<float> random_ties(std::mt19937& rng, int n, int distinct) {
  std::uniform_int_distribution<int> d(0, distinct - 1);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(d(rng));
  return v;
}

TEST(TorchOrder, SmallSortKeepsEqualValuesInIndexOrder) {
  // Up to 16 items torch's CPU sort is an insertion sort: stable.
  const std::vector<float> v = {1, 1, 1, 2, 2};
  EXPECT_EQ(torch_sort_descending(v), (std::vector<int32_t>{3, 4, 0, 1, 2}));
}

TEST(TorchOrder, SortIsDescendingPermutation) {
  std::mt19937 rng(1);
  for (int n : {0, 1, 2, 15, 16, 17, 33, 100, 1000}) {
    const auto v = random_ties(rng, n, 5);
    const auto order = torch_sort_descending(v);
    ASSERT_EQ(order.size(), v.size());
    std::vector<int32_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
    for (int i = 1; i < n; ++i) ASSERT_GE(v[order[i - 1]], v[order[i]]);
  }
}

TEST(TorchOrder, LargeSortWithTiesIsNotStable) {
  // Above 16 items the quicksort phase reorders equal values; torch does the same (the
  // fixtures in tests/data/eplb/big_sort.json check the exact order against torch).
  std::mt19937 rng(2);
  bool some_unstable = false;
  for (int t = 0; t < 20 && !some_unstable; ++t) {
    const auto v = random_ties(rng, 40, 3);
    const auto order = torch_sort_descending(v);
    std::vector<int32_t> stable(v.size());
    for (size_t i = 0; i < v.size(); ++i) stable[i] = int32_t(i);
    std::stable_sort(stable.begin(), stable.end(), [&](int a, int b) { return v[a] > v[b]; });
    some_unstable = order != stable;
  }
  EXPECT_TRUE(some_unstable);
}

TEST(TorchOrder, ArgmaxTakesFirstOfEqualMaxima) {
  EXPECT_EQ(torch_argmax(std::vector<float>{1, 3, 2, 3}), 1);
  EXPECT_EQ(torch_argmax(std::vector<float>{5}), 0);
  EXPECT_EQ(torch_argmax(std::vector<float>{0, 0, 0}), 0);
}

#if defined(__GLIBCXX__)
// torch's CPU build uses libstdc++'s std::sort; where this build does too, the re-implementation
// must order every input exactly like it (ties included), in every phase of the algorithm.
std::vector<detail::Keyed> keyed(const std::vector<float>& v) {
  std::vector<detail::Keyed> k(v.size());
  for (size_t i = 0; i < v.size(); ++i) k[i] = {v[i], int32_t(i)};
  return k;
}
std::vector<int32_t> indices(const std::vector<detail::Keyed>& k) {
  std::vector<int32_t> out;
  for (const auto& x : k) out.push_back(x.index);
  return out;
}
const auto kDesc = [](const detail::Keyed& a, const detail::Keyed& b) { return a.value > b.value; };

TEST(TorchOrder, IntrosortMatchesLibstdcxxSort) {
  std::mt19937 rng(3);
  for (int n : {2, 5, 16, 17, 18, 31, 32, 33, 64, 100, 257, 1000, 3000}) {
    for (int distinct : {1, 2, 3, 10, 1000000}) {
      const auto v = random_ties(rng, n, distinct);
      auto mine = keyed(v), ref = keyed(v);
      detail::introsort_descending(mine);
      std::sort(ref.begin(), ref.end(), kDesc);
      ASSERT_EQ(indices(mine), indices(ref)) << "n=" << n << " distinct=" << distinct;
    }
  }
}

TEST(TorchOrder, HeapsortFallbackMatchesLibstdcxxPartialSort) {
  std::mt19937 rng(4);
  for (int n : {2, 3, 7, 16, 17, 50, 333}) {
    for (int distinct : {1, 3, 1000000}) {
      const auto v = random_ties(rng, n, distinct);
      auto mine = keyed(v), ref = keyed(v);
      detail::heapsort_descending(mine);
      std::partial_sort(ref.begin(), ref.end(), ref.end(), kDesc);
      ASSERT_EQ(indices(mine), indices(ref)) << "n=" << n << " distinct=" << distinct;
    }
  }
}

TEST(TorchOrder, DepthLimitedIntrosortIsStillASort) {
  // Depth 0 sends the whole range through heapsort and then the final insertion sort.
  std::mt19937 rng(5);
  const auto v = random_ties(rng, 200, 4);
  auto k = keyed(v);
  detail::introsort_descending(k, 0);
  for (size_t i = 1; i < k.size(); ++i) ASSERT_GE(k[i - 1].value, k[i].value);
}
#endif

}  // namespace
}  // namespace moeserve::eplb
