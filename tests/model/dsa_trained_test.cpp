// The trained tiny V3.2 (assets/models/tiny-py-v32, tools/train_tiny_v32.py: tiny-py continued
// with DeepSeek's recipe, index top-k 64) against transformers' deepseek_v32 on it, an
// implementation no one here wrote (tools/gen_hf_fixtures.py --only tiny-py-v32 ->
// tests/data/dsa/tiny-py-v32/expected.json): held-out prompts of 96 and 320 tokens, so attention is
// sparse, and transformers' 40 greedy steps after each, teacher-forced here along its tokens.
// Few prompts of this model have no near tie in 40 steps, so steps are compared as the V4 trained
// fixture's are: every step's logprobs, the greedy token only where transformers' top-2 gap says
// it is not a near tie. The generator takes prompts without an exact tie at the index top-k
// boundary (positions whose every head's ReLU is zero score exactly 0, and torch.topk orders
// ties as it likes: a first draw with one such row put the reference path 0.067 off from there).
//
// Measured (2026-12-07, Zen 4; median / max |dlogprob| over 80 steps, greedy tokens that differ
// where transformers' top-2 gap exceeds the tie gap):
//   reference, F32 cache                  7.5e-5 / 3.2e-4, 0 of 77
//   fast, F32 cache (F32 index keys)      4.7e-3 / 1.7e-2, 0 of 75 (every step within the
//                                         issue's 5e-2: BF16 activations are its only rounding)
//   fast, BF16 cache (FP8 index keys)     1.0e-2 / 0.81, 0 of 75
//   fast, FP8 cache                       2.1e-2 / 0.90, 1 of 75
// The fast path's tail is the steps where DeepSeek's FP8 index keys pick other tokens than
// transformers' F32 ones (docs/dsa.md, "Which arithmetic").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "ep/dispatcher.h"
#include "kernels/sampling.h"
#include "model/checkpoint.h"
#include "model/deepseek.h"

namespace moeserve {
namespace {

using json = nlohmann::json;

constexpr float kRefTol = 2e-3f;     // the reference path (the issue: within 2e-3)
constexpr float kRefTieGap = 0.05f;  // its greedy token is checked above this top-2 gap
constexpr float kFastTieGap = 0.1f;  // the fast path's

struct FixtureRun {
  std::vector<float> errs;  // per step, the largest |dlogprob| over transformers' top-5
  int64_t greedy_checked = 0, greedy_differ = 0;
};

// Teacher-forced along every fixture prompt's tokens: the prompt in one step, then one token a
// step, each step's logits against transformers' top-5 for it.
FixtureRun along_fixture(DeepseekModel& model, const ModelConfig& cfg, const json& fx,
                         DType kv_dtype, float tie_gap) {
  FixtureRun r;
  std::vector<float> lp(size_t(cfg.vocab_size));
  for (const json& p : fx["prompts"]) {
    const std::vector<int32_t> prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> tokens = p["tokens"].get<std::vector<int32_t>>();
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), tokens.begin(), tokens.end());
    std::vector<int32_t> table;
    for (int32_t b = 0; b * kKvBlockSize < int64_t(seq.size()); ++b) table.push_back(b);
    KvCache cache(kv_cache_layout(cfg, kv_dtype), int32_t(table.size()));
    int64_t pos = 0, n_new = int64_t(prompt.size());
    for (size_t s = 0; s < tokens.size(); ++s) {
      StepSequence step{std::span<const int32_t>(seq).subspan(size_t(pos), size_t(n_new)), pos,
                        table, 1};
      StepOutput out;
      EXPECT_TRUE(model.forward({&step, 1}, cache, &out).ok());
      if (out.logits.size() != size_t(cfg.vocab_size)) return r;
      pos += n_new;
      n_new = 1;
      log_softmax(out.logits.data(), cfg.vocab_size, lp.data());
      const json& top = p["top_logprobs"][s];
      float e = 0;
      for (const json& t : top) {
        e = std::max(e, std::fabs(lp[t["id"].get<size_t>()] - t["logprob"].get<float>()));
      }
      r.errs.push_back(e);
      if (top[0]["logprob"].get<float>() - top[1]["logprob"].get<float>() > tie_gap) {
        ++r.greedy_checked;
        r.greedy_differ += argmax(out.logits.data(), cfg.vocab_size) != tokens[s];
      }
    }
  }
  std::sort(r.errs.begin(), r.errs.end());
  return r;
}

TEST(DsaTrained, PathsMatchTransformers) {
  std::ifstream in("tests/data/dsa/tiny-py-v32/expected.json");
  ASSERT_TRUE(in.good()) << "tests/data/dsa/tiny-py-v32/expected.json";
  const json fx = json::parse(in);
  auto ck = Checkpoint::open(std::string(MOESERVE_MODELS_DIR) + "/tiny-py-v32");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& cfg = (*ck)->config();
  ASSERT_TRUE(cfg.indexer);
  for (const json& p : fx["prompts"]) {
    EXPECT_GT(int64_t(p["prompt_ids"].size()), cfg.indexer->topk) << "attention would be dense";
  }
  ThreadPool pool(2);
  LocalDispatcher dispatcher(cfg.n_routed_experts);
  struct Case {
    ComputePath path;
    DType kv;
    const char* name;
    float median_bound;  // the fast path's: twice the measured median
  };
  for (const Case& k : {Case{ComputePath::kReference, DType::kF32, "reference, F32 cache", 0},
                        Case{ComputePath::kFast, DType::kF32,
                             "fast, F32 cache (transformers' F32 index keys)", 1.2e-2f},
                        Case{ComputePath::kFast, DType::kBF16,
                             "fast, BF16 cache (DeepSeek's FP8 index keys)", 2e-2f},
                        Case{ComputePath::kFast, DType::kF8E4M3,
                             "fast, FP8 cache (DeepSeek's FP8 index keys)", 4.2e-2f}}) {
    DeepseekModel model(cfg, (*ck)->weights(), dispatcher, &pool, AttentionMode::kAbsorbed, k.path);
    const bool ref = k.path == ComputePath::kReference;
    const FixtureRun r = along_fixture(model, cfg, fx, k.kv, ref ? kRefTieGap : kFastTieGap);
    ASSERT_FALSE(r.errs.empty());
    const float median = r.errs[r.errs.size() / 2], p99 = r.errs[r.errs.size() * 99 / 100];
    std::printf(
        "V3.2 trained, %s: |dlogprob| median %.2e, p99 %.2e, max %.2e over %zu steps; greedy "
        "token differs on %ld of %ld steps without a near tie\n",
        k.name, median, p99, r.errs.back(), r.errs.size(), long(r.greedy_differ),
        long(r.greedy_checked));
    if (ref) {
      EXPECT_LT(r.errs.back(), kRefTol);
      EXPECT_EQ(r.greedy_differ, 0);
    } else {
      EXPECT_LT(median, k.median_bound) << k.name;
      if (k.kv == DType::kF32) {
        EXPECT_LT(r.errs.back(), 5e-2f) << k.name;
      }
      EXPECT_LE(r.greedy_differ * 20, r.greedy_checked) << k.name;
    }
    EXPECT_GT(r.greedy_checked, 40) << k.name;
  }
}

}  // namespace
}  // namespace moeserve
