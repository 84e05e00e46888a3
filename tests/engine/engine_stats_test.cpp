// EngineStats (engine/engine.h): one list of fields, summed over an EP group's ranks.
#include <gtest/gtest.h>

#include <tuple>

#include "engine/engine.h"

namespace moeserve {
namespace {

// Gives every listed field (and each element of an array field) a distinct value from `next`.
void fill(EngineStats& s, int64_t& next) {
  auto set = [&](auto& f) {
    if constexpr (std::is_same_v<std::decay_t<decltype(f)>, int64_t>) {
      f = next++;
    } else {
      for (int64_t& x : f) x = next++;
    }
  };
  std::apply([&](auto... m) { (set(s.*m), ...); }, EngineStats::fields());
}

TEST(EngineStats, RanksAddUpInEveryFieldButSteps) {
  int64_t next = 1;
  EngineStats a, b;
  fill(a, next);
  fill(b, next);
  a.steps = 5;
  b.steps = 9;
  EngineStats sum = a;
  sum += b;
  EXPECT_EQ(sum.steps, 5);  // the ranks step together: the group's steps are rank 0's
  EXPECT_EQ(sum.running, a.running + b.running);
  EXPECT_EQ(sum.grammar_ns, a.grammar_ns + b.grammar_ns);
  EXPECT_EQ(sum.kv_disk_rejected[6], a.kv_disk_rejected[6] + b.kv_disk_rejected[6]);
  EXPECT_EQ(sum.spec_accepted[2], a.spec_accepted[2] + b.spec_accepted[2]);
  // Every field: sum - a == b, element by element.
  int64_t checked = 0;
  auto check = [&](const auto& s, const auto& x, const auto& y) {
    if constexpr (std::is_same_v<std::decay_t<decltype(s)>, int64_t>) {
      EXPECT_EQ(s - x, y);
      ++checked;
    } else {
      for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i] - x[i], y[i]);
      checked += int64_t(s.size());
    }
  };
  std::apply([&](auto... m) { (check(sum.*m, a.*m, b.*m), ...); }, EngineStats::fields());
  EXPECT_EQ(checked * int64_t(sizeof(int64_t)) + int64_t(sizeof(int64_t)),
            int64_t(sizeof(EngineStats)));
}

}  // namespace
}  // namespace moeserve
