// sample_token: greedy, the softmax frequencies with temperature, and the top-k / top-p cuts
// against a brute-force reference (full sort of the vocabulary), on small and vocabulary-sized
// inputs; the same rng state gives the same token.
#include "kernels/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <tuple>
#include <vector>

namespace moeserve {
namespace {

// The allowed set by definition: sort everything by (logit desc, id asc), cut k, then the
// smallest prefix whose tempered probability (within the k) reaches top_p.
std::set<int32_t> allowed(const std::vector<float>& l, const SamplingParams& p) {
  std::vector<int32_t> idx(l.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
  });
  size_t k = p.top_k > 0 ? std::min(idx.size(), size_t(p.top_k)) : idx.size();
  std::vector<double> w(k);
  double total = 0;
  for (size_t i = 0; i < k; ++i)
    total += w[i] = std::exp((l[size_t(idx[i])] - l[size_t(idx[0])]) / p.temperature);
  std::set<int32_t> out;
  double cum = 0;
  for (size_t i = 0; i < k; ++i) {
    out.insert(idx[i]);
    cum += w[i] / total;
    if (cum >= p.top_p) break;
  }
  return out;
}

TEST(Sampling, GreedyAtZeroTemperature) {
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  std::mt19937_64 rng(1);
  EXPECT_EQ(sample_token(l.data(), 4, SamplingParams{0.0f, 1.0f, 0}, rng), 1);
}

// Frequencies over 200k draws within 5 standard deviations of the tempered softmax, with and
// without cuts (the cut ones renormalised over the allowed set).
TEST(Sampling, FrequenciesFollowTheTemperedSoftmax) {
  const std::vector<float> l = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f};
  for (SamplingParams p :
       {SamplingParams{1.0f, 1.0f, 0}, SamplingParams{0.7f, 1.0f, 0}, SamplingParams{1.0f, 1.0f, 3},
        SamplingParams{1.3f, 0.8f, 0}, SamplingParams{1.0f, 0.9f, 4}}) {
    std::set<int32_t> ok = allowed(l, p);
    std::vector<double> want(l.size(), 0.0);
    double z = 0;
    for (int32_t i : ok) z += want[size_t(i)] = std::exp(l[size_t(i)] / p.temperature);
    for (double& w : want) w /= z;
    std::mt19937_64 rng(7);
    const int draws = 200000;
    std::vector<int> count(l.size(), 0);
    for (int d = 0; d < draws; ++d)
      ++count[size_t(sample_token(l.data(), int64_t(l.size()), p, rng))];
    for (size_t i = 0; i < l.size(); ++i) {
      const double sd = std::sqrt(draws * want[i] * (1 - want[i])) + 1e-9;
      EXPECT_NEAR(count[i], draws * want[i], 5 * sd + (want[i] == 0 ? 0 : 1))
          << "token " << i << " T=" << p.temperature << " top_p=" << p.top_p
          << " top_k=" << p.top_k;
    }
  }
}

// A vocabulary-sized row (129280 logits): every draw falls in the allowed set, which the
// reference builds by sorting everything; the same seed repeats the same tokens.
TEST(Sampling, VocabularySizedCutsMatchTheFullSort) {
  std::mt19937 g(3);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> l(129280);
  for (float& x : l) x = d(g);
  l[17] = l[99] = 14.0f;  // a tie at the top
  for (SamplingParams p : {SamplingParams{1.0f, 0.9f, 0}, SamplingParams{0.5f, 0.95f, 0},
                           SamplingParams{1.0f, 1.0f, 40}, SamplingParams{2.0f, 0.5f, 1000},
                           SamplingParams{1.0f, 1.0f, 0}}) {
    std::set<int32_t> ok = allowed(l, p);
    std::mt19937_64 a(11), b(11);
    std::set<int32_t> seen;
    for (int i = 0; i < 60; ++i) {
      int32_t t = sample_token(l.data(), int64_t(l.size()), p, a);
      ASSERT_EQ(t, sample_token(l.data(), int64_t(l.size()), p, b)) << "not reproducible";
      ASSERT_TRUE(ok.count(t)) << "token " << t << " outside the allowed set (top_p " << p.top_p
                               << ", top_k " << p.top_k << ")";
      seen.insert(t);
    }
    if (ok.size() > 1) {
      EXPECT_GT(seen.size(), 1u);  // it does sample, not always the best
    }
  }
}

// ---- verify_drafts: speculative verification keeps the target distribution ----

// The tempered, top-k-cut softmax of logits, by definition (full sort).
std::vector<double> target_probs(const std::vector<float>& l, const SamplingParams& p) {
  const int64_t n = int64_t(l.size());
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  const int64_t keep = p.top_k > 0 ? std::min<int64_t>(p.top_k, n) : n;
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) {
    total += out[size_t(order[size_t(i)])] = std::exp(double(l[order[size_t(i)]]) / p.temperature);
  }
  for (double& v : out) v /= total;
  return out;
}

// A two-token target (t1 from `first`, t2 from second[t1]) drafted by fixed guesses; one trial
// runs the engine's walk: verify_drafts over the rows the target gives for the drafts, then,
// where it stopped early, t2 sampled from the row after the correction (the next step).
// Returns Pearson's chi-square of the joint (t1, t2) counts against the exact joint.
double joint_chi_square(const SamplingParams& sp, bool wrong_sampler, int64_t trials) {
  const int64_t V = 5;
  const std::vector<float> first = {1.2f, 0.1f, 0.9f, -0.4f, 0.5f};
  const std::vector<std::vector<float>> second = {{0.3f, 1.1f, -0.2f, 0.0f, 0.6f},
                                                  {1.5f, -1.0f, 0.2f, 0.4f, 0.1f},
                                                  {-0.3f, 0.2f, 0.9f, 1.3f, 0.0f},
                                                  {0.0f, 0.0f, 0.7f, -0.5f, 1.0f},
                                                  {0.8f, 0.3f, -0.6f, 0.2f, 0.4f}};
  const std::vector<int32_t> drafts = {2, 3};  // t1 = 2 likely-ish, then t2 = 3 given it
  std::vector<float> rows(first);
  rows.insert(rows.end(), second[2].begin(), second[2].end());  // the target given draft 1
  rows.insert(rows.end(), second[0].begin(), second[0].end());  // (row 3: unused here)
  std::mt19937_64 rng(99);
  std::vector<int64_t> count(size_t(V * V), 0);
  for (int64_t i = 0; i < trials; ++i) {
    std::vector<int32_t> out;
    if (wrong_sampler) {
      // A plausible bug: keep the draft with probability p(d), else draw again from all of p
      // (the draft included) — the draft token comes out too often.
      const std::vector<double> p = target_probs(first, sp);
      if (std::uniform_real_distribution<double>(0, 1)(rng) < p[size_t(drafts[0])]) {
        out = {drafts[0], sample_token(second[size_t(drafts[0])].data(), V, sp, rng)};
      } else {
        out = {sample_token(first.data(), V, sp, rng)};
      }
    } else {
      out = verify_drafts(rows.data(), V, std::span<const int32_t>(drafts).first(1), sp, rng);
    }
    if (out.size() == 1) out.push_back(sample_token(second[size_t(out[0])].data(), V, sp, rng));
    ++count[size_t(out[0] * V + out[1])];
  }
  const std::vector<double> p1 = target_probs(first, sp);
  double chi = 0;
  for (int64_t a = 0; a < V; ++a) {
    const std::vector<double> p2 = target_probs(second[size_t(a)], sp);
    for (int64_t b = 0; b < V; ++b) {
      const double e = double(trials) * p1[size_t(a)] * p2[size_t(b)];
      if (e == 0) {
        EXPECT_EQ(count[size_t(a * V + b)], 0) << a << "," << b;
        continue;
      }
      const double d = double(count[size_t(a * V + b)]) - e;
      chi += d * d / e;
    }
  }
  return chi;
}

TEST(VerifyDrafts, KeepsTheTargetDistributionExactly) {
  // 24 degrees of freedom (21 with top-k 4: one token cut, 9 zero cells): the 0.1% critical
  // value is 51.2; the wrong sampler lands in the thousands with these many trials.
  constexpr double kCritical = 51.2;
  for (const SamplingParams& sp : {SamplingParams{1.0f, 1.0f, 0}, SamplingParams{0.7f, 1.0f, 0},
                                   SamplingParams{1.3f, 1.0f, 4}}) {
    const double right = joint_chi_square(sp, false, 200000);
    const double wrong = joint_chi_square(sp, true, 200000);
    EXPECT_LT(right, kCritical) << "temperature " << sp.temperature << " top_k " << sp.top_k;
    EXPECT_GT(wrong, 10 * kCritical) << "the test must catch a wrong sampler";
    std::printf("[ T=%.1f top_k=%lld ] chi-square %.1f (wrong sampler %.0f)\n", sp.temperature,
                static_cast<long long>(sp.top_k), right, wrong);
  }
}

TEST(VerifyDrafts, GreedyKeepsTheLongestMatchingPrefixAndTheBonus) {
  const int64_t V = 4;
  // Row argmaxes 1, 2, 3, 0.
  const std::vector<float> rows = {0, 5, 1, 2, /**/ 0, 1, 5, 2, /**/ 0, 1, 2, 5, /**/ 5, 1, 2, 0};
  std::mt19937_64 rng(1);
  const std::vector<int32_t> all = {1, 2, 3};
  EXPECT_EQ(verify_drafts(rows.data(), V, all, {}, rng), (std::vector<int32_t>{1, 2, 3, 0}));
  const std::vector<int32_t> second_wrong = {1, 0, 3};
  EXPECT_EQ(verify_drafts(rows.data(), V, second_wrong, {}, rng), (std::vector<int32_t>{1, 2}));
  const std::vector<int32_t> first_wrong = {3, 2, 3};
  EXPECT_EQ(verify_drafts(rows.data(), V, first_wrong, {}, rng), (std::vector<int32_t>{1}));
  EXPECT_EQ(verify_drafts(rows.data(), V, {}, {}, rng), (std::vector<int32_t>{1}));
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

// A re-bound request's sampler is advanced one draw per token it already emitted
// (engine/handoff.h extend_handoff): every sampled token costs exactly one mt19937_64 draw,
// whatever the cuts, and a greedy one none.
TEST(Sampling, EachSampledTokenCostsExactlyOneDraw) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float((i * 7919) % 97) / 13.0f;
  SamplingParams with_min_p{0.9f, 1.0f, 0};
  with_min_p.min_p = 0.5f;
  for (SamplingParams p : {SamplingParams{0.8f, 1.0f, 0}, SamplingParams{0.8f, 0.9f, 0},
                           SamplingParams{1.2f, 1.0f, 40}, SamplingParams{0.7f, 0.5f, 100},
                           SamplingParams{0.0f, 1.0f, 0}, with_min_p}) {
    std::mt19937_64 rng(99), ref(99);
    for (int t = 0; t < 50; ++t) {
      (void)sample_token(l.data(), int64_t(l.size()), p, rng);
      if (p.temperature > 0) ref.discard(1);
      ASSERT_EQ(rng, ref) << "temperature " << p.temperature << " top_p " << p.top_p << " top_k "
                          << p.top_k << " token " << t;
    }
  }
}

// ---- Logit adjustments and min_p ----

// The adjusted logits by the formulas of kernels/sampling.h, token by token: logit_bias, then
// the repetition penalty for tokens in the prompt or the output, then frequency and presence
// for tokens in the output.
std::vector<float> adjusted_by_definition(std::vector<float> l, const SamplingParams& p,
                                          const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& output) {
  for (size_t t = 0; t < l.size(); ++t) {
    for (const auto& [id, bias] : p.logit_bias) {
      if (size_t(id) == t) l[t] += bias;
    }
    const int64_t count = std::count(output.begin(), output.end(), int32_t(t));
    const bool in_prompt = std::find(prompt.begin(), prompt.end(), int32_t(t)) != prompt.end();
    if (in_prompt || count > 0) {
      l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
    }
    if (count > 0) l[t] -= p.frequency_penalty * float(count) + p.presence_penalty;
  }
  return l;
}

TEST(LogitAdjuster, EachAdjustmentAndAllTogetherMatchTheirDefinition) {
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> row(500);
  for (float& x : row) x = d(g);
  const std::vector<int32_t> prompt = {3, 3, 17, 250, 499, 0};
  const std::vector<int32_t> output = {17, 17, 17, 42, 250, 7, 42};
  SamplingParams bias, rep, freq, all;
  bias.logit_bias = {{0, 5.0f}, {42, -100.0f}, {300, 0.25f}};
  rep.repetition_penalty = 1.7f;
  freq.frequency_penalty = 0.6f;
  freq.presence_penalty = -0.4f;
  all = freq;
  all.repetition_penalty = 0.8f;
  all.logit_bias = bias.logit_bias;
  for (const SamplingParams& p : {bias, rep, freq, all}) {
    ASSERT_TRUE(p.adjusts_logits());
    std::vector<float> got = row;
    LogitAdjuster(p, TokenHistory{prompt, output}).apply(got.data(), int64_t(got.size()));
    EXPECT_EQ(got, adjusted_by_definition(row, p, prompt, output));
    // add() appends to the output: the same as an adjuster over the longer output.
    LogitAdjuster grown(p, TokenHistory{prompt, std::span(output).first(3)});
    for (size_t i = 3; i < output.size(); ++i) grown.add(output[i]);
    std::vector<float> again = row;
    grown.apply(again.data(), int64_t(again.size()));
    EXPECT_EQ(again, got);
  }
  EXPECT_FALSE(SamplingParams{}.adjusts_logits());
}

// min_p: no token whose tempered probability is below min_p times the largest is ever drawn,
// and the rest keep their renormalised frequencies (200k draws, 5 standard deviations); with
// top-k and top-p after it.
TEST(Sampling, MinPCutsTheUnlikelyAndKeepsTheRestsProportions) {
  const std::vector<float> l = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -3.0f};
  for (auto [temperature, min_p, top_k, top_p] :
       {std::tuple{1.0f, 0.3f, 0, 1.0f}, std::tuple{0.7f, 0.1f, 0, 1.0f},
        std::tuple{1.0f, 0.2f, 4, 1.0f}, std::tuple{1.3f, 0.25f, 0, 0.9f}}) {
    SamplingParams p;
    p.temperature = temperature;
    p.min_p = min_p;
    p.top_k = top_k;
    p.top_p = top_p;
    // Kept by min_p, then by top-k / top-p among those (allowed() on the survivors).
    const float mx = *std::max_element(l.begin(), l.end());
    std::vector<float> survivors = l;
    for (float& x : survivors) {
      if (std::exp((x - mx) / temperature) < min_p) x = -1e30f;
    }
    std::set<int32_t> ok;
    for (int32_t i : allowed(survivors, p)) {
      if (survivors[size_t(i)] > -1e29f) ok.insert(i);
    }
    std::vector<double> want(l.size(), 0.0);
    double z = 0;
    for (int32_t i : ok) z += want[size_t(i)] = std::exp(l[size_t(i)] / temperature);
    for (double& w : want) w /= z;
    std::mt19937_64 rng(8);
    const int draws = 200000;
    std::vector<int> count(l.size(), 0);
    for (int k = 0; k < draws; ++k)
      ++count[size_t(sample_token(l.data(), int64_t(l.size()), p, rng))];
    for (size_t i = 0; i < l.size(); ++i) {
      if (want[i] == 0) {
        EXPECT_EQ(count[i], 0) << "token " << i << " min_p " << min_p;
        continue;
      }
      const double sd = std::sqrt(draws * want[i] * (1 - want[i]));
      EXPECT_NEAR(count[i], draws * want[i], 5 * sd + 1) << "token " << i << " min_p " << min_p;
    }
    EXPECT_LT(ok.size(), l.size()) << "min_p " << min_p << " cut nothing";
  }
}

// MTP with adjustments: verify_drafts gives the tokens of sampling the adjusted rows one at a
// time (each row adjusted for the tokens before it), with the same draws, greedy and sampled.
TEST(VerifyDrafts, AdjustedRowsGiveTheStepByStepTokens) {
  std::mt19937 g(6);
  std::normal_distribution<float> d(0.0f, 1.5f);
  const int64_t V = 64, K = 4;
  std::vector<float> rows(size_t((K + 1) * V));
  for (float& x : rows) x = d(g);
  SamplingParams p;
  p.presence_penalty = 1.0f;
  p.frequency_penalty = 0.7f;
  p.repetition_penalty = 1.4f;
  p.logit_bias = {{1, 0.8f}};
  const std::vector<int32_t> prompt = {1, 2, 3}, output = {5, 5};
  for (float temperature : {0.0f, 1.0f}) {
    p.temperature = temperature;
    for (int trial = 0; trial < 50; ++trial) {
      // The step-by-step tokens for the rows, then drafts that agree with them up to a point.
      std::mt19937_64 a(100 + uint64_t(trial)), b = a;
      std::vector<int32_t> seq = output, steps;
      for (int64_t j = 0; j <= K; ++j) {
        std::vector<float> row(rows.begin() + j * V, rows.begin() + (j + 1) * V);
        row = adjusted_by_definition(row, p, prompt, seq);
        steps.push_back(sample_token(row.data(), V, p, a));
        seq.push_back(steps.back());
      }
      std::vector<int32_t> drafts(steps.begin(), steps.begin() + K);
      const int64_t wrong = trial % (K + 1);  // (K: all drafts right)
      if (wrong < K) drafts[size_t(wrong)] = (drafts[size_t(wrong)] + 1) % int32_t(V);
      const std::vector<int32_t> got =
          verify_drafts(rows.data(), V, drafts, p, b, TokenHistory{prompt, output});
      const std::vector<int32_t> want(steps.begin(), steps.begin() + std::min(wrong, K) + 1);
      ASSERT_EQ(got, want) << "temperature " << temperature << " trial " << trial;
    }
  }
}

}  // namespace
}  // namespace moeserve
