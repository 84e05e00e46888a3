// DraftPolicy (docs/mtp.md "The load policy"): against synthetic step costs it settles on the
// k with the most tokens per second, per load, and re-measures the others now and then.
#include "engine/draft_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

namespace moeserve {
namespace {

// Drives the policy for `steps` pure decode steps at `decoding` sequences; a step with k drafts
// per sequence costs cost(k) seconds and emits tokens(k) per sequence. Returns how often each k
// was chosen over the last half.
std::map<int64_t, int> drive(DraftPolicy& p, int64_t decoding, int steps,
                             const std::function<double(int64_t)>& cost,
                             const std::function<double(int64_t)>& tokens) {
  std::map<int64_t, int> chosen;
  int64_t verified = 0;
  for (int i = 0; i < steps; ++i) {
    const int64_t k = p.choose(decoding);
    p.record(decoding, verified, k, cost(verified),
             int64_t(tokens(verified) * double(decoding) + 0.5));
    verified = k;
    if (i >= steps / 2) ++chosen[k];
  }
  return chosen;
}

TEST(DraftPolicy, SettlesOnTheFastestSettingPerLoad) {
  DraftPolicy p(3);
  // Weight-bound at one stream: drafts nearly free, 0.75 acceptance per position.
  auto accepted = [](int64_t k) { return k == 0 ? 1.0 : 1.0 + 0.75 * (1 - std::pow(0.75, k)) / 0.25; };
  auto cheap = [](int64_t k) { return 1e-3 * (1.0 + 0.05 * double(k)); };
  auto one = drive(p, 1, 400, cheap, accepted);
  EXPECT_GT(one[3], 150) << "K = 3 is fastest here";
  // Compute-bound at 32 streams: every row costs its share.
  auto costly = [](int64_t k) { return 1e-3 * (1.0 + 1.2 * double(k)); };
  auto many = drive(p, 32, 400, costly, accepted);
  EXPECT_GT(many[0], 150) << "no drafts is fastest here";
  // The one-stream bucket kept its own choice.
  EXPECT_GT(p.rate(1, 3), p.rate(1, 0));
  EXPECT_GT(p.rate(32, 0), p.rate(32, 1));
  // The other settings are re-measured, but rarely.
  EXPECT_GT(many[1] + many[2] + many[3], 0);
  EXPECT_LT(many[1] + many[2] + many[3], 40);
}

TEST(DraftPolicy, CountsOnlySteadySteps) {
  DraftPolicy p(1);
  p.record(4, 0, 1, 1e-3, 4);  // a switch's step: not a sample of either
  EXPECT_EQ(p.rate(4, 0), 0);
  EXPECT_EQ(p.rate(4, 1), 0);
  p.record(4, 1, 1, 1e-3, 8);
  EXPECT_DOUBLE_EQ(p.rate(4, 1), 8000);
  EXPECT_EQ(DraftPolicy(0).choose(4), 0);  // speculative decoding off
}

}  // namespace
}  // namespace moeserve
