// Agreement with Hugging Face transformers (an implementation no one here wrote) on small
// random checkpoints in the official FP8 format. Fixtures: tools/gen_hf_fixtures.py ->
// tests/data/hf/<name>/ (checkpoint + expected.json with greedy tokens and top-5 logprobs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "kernels/sampling.h"
#include "model/deepseek.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr float kLogprobTol = 2e-2f;  // reference path (FP32 activations)
// The fast path (BF16 GEMM inputs, BF16 KV cache) runs against the fixtures too. It does not
// meet 5e-2 here: the BF16 latent cache alone (every other input exact) leaves 0.045-0.063
// (docs/hf-reference.md has the per-source table). Steps where rounding flipped a near-tied
// expert choice of the measured token (2.65 on one yarn_mscale step) are left out and counted
// (see the test). Measured: 0.079-0.150, 0-2 steps left out per fixture; held to twice the
// largest, which a missing YaRN term, mscale, bias or group limit (4-15 on the same fixtures)
// and smaller kernel errors exceed.
constexpr float kFastBound = 0.3f;
std::vector<ComputePath> compute_paths() {
  return {ComputePath::kReference, ComputePath::kFast};
}
// A trained checkpoint (tools/train_tiny.py, assets/models/) has confident predictions, and is
// held to tighter bounds: the reference path to 2e-3 (measured 2.9e-4), the fast path on every
// step with no step left out, and the fast path's greedy tokens equal to the reference's on
// every step. The fast path measures 0.061-0.067 on tiny-py, over the 5e-2 aimed for: the BF16
// latent cache alone (reference arithmetic, BF16 cache) gives 0.047 and BF16 GEMM inputs alone
// (F32 cache) 0.018 (docs/hf-reference.md section 10); held to 0.08, 1.2x the measured.
constexpr float kTrainedLogprobTol = 2e-3f;
constexpr float kTrainedFastBound = 0.08f;
constexpr float kNearTie = 0.05f;  // reference top-2 closer than this: order may differ
constexpr size_t kMinSteps = 16;

struct Step {
  int32_t token;
  std::vector<TokenLogprob> top;  // reference top-5
};
struct Case {
  std::vector<int32_t> prompt;
  std::vector<Step> steps;
};

json load_expected(const std::string& name) {
  std::ifstream in("tests/data/hf/" + name + "/expected.json");
  return json::parse(in);
}

// The checkpoint of a fixture: beside its expected.json, or the trained model it names under
// the build's models/ directory.
std::string checkpoint_dir(const std::string& name) {
  json j = load_expected(name);
  if (j.contains("checkpoint")) {
    return std::string(MOESERVE_MODELS_DIR) + "/" + j["checkpoint"].get<std::string>();
  }
  return "tests/data/hf/" + name;
}

bool is_trained(const std::string& name) {
  return load_expected(name).value("trained", false);
}

std::vector<Case> load_cases(const std::string& name) {
  json j = load_expected(name);
  std::vector<Case> cases;
  for (const json& p : j["prompts"]) {
    Case c;
    c.prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    auto tokens = p["tokens"].get<std::vector<int32_t>>();
    for (size_t s = 0; s < tokens.size(); ++s) {
      Step st{tokens[s], {}};
      for (const json& t : p["top_logprobs"][s]) {
        st.top.push_back({t["id"].get<int32_t>(), t["logprob"].get<float>()});
      }
      c.steps.push_back(std::move(st));
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

// First step where the reference's top-2 are within kNearTie (tokens may legitimately differ
// from there on), plus one, or the number of steps.
size_t comparable_steps(const Case& c, float near_tie = kNearTie) {
  for (size_t s = 0; s < c.steps.size(); ++s) {
    if (c.steps[s].top.size() >= 2 &&
        c.steps[s].top[0].logprob - c.steps[s].top[1].logprob < near_tie) {
      return s + 1;  // this step's logprobs are still comparable; its argmax is not
    }
  }
  return c.steps.size();
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  fs::path root = "tests/data/hf";
  if (!fs::exists(root)) return names;
  for (const auto& e : fs::directory_iterator(root)) {
    if (fs::exists(e.path() / "expected.json")) names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

const char* mode_name(AttentionMode mode) {
  return mode == AttentionMode::kNaive        ? "naive"
         : mode == AttentionMode::kMhaPrefill ? "mha_prefill"
                                              : "absorbed";
}

// Parameters: fixture name, attention form, compute path. kMhaPrefill runs every prompt's
// prefill in MHA form (set_mha_min_tokens(2)) and the decode steps absorbed.
class HfReference
    : public ::testing::TestWithParam<std::tuple<std::string, AttentionMode, ComputePath>> {
 protected:
  bool fast() const { return std::get<2>(GetParam()) == ComputePath::kFast; }
  DType kv_dtype() const {
    return std::get<2>(GetParam()) == ComputePath::kFast ? DType::kBF16 : DType::kF32;
  }
};

// Teacher forcing along the reference's greedy path: at every step our logprobs of the
// reference's top-5 tokens must match, and our argmax must be its token unless it was a near tie.
TEST_P(HfReference, LogprobsAlongReferencePath) {
  auto [name, mode, path] = GetParam();
  const bool trained = is_trained(name);
  auto ck = Checkpoint::open(checkpoint_dir(name));
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& cfg = (*ck)->config();
  ThreadPool pool(2);
  LocalDispatcher dispatcher(cfg.n_routed_experts);
  DeepseekModel model(cfg, (*ck)->weights(), dispatcher, &pool, mode, path);
  model.set_mha_min_tokens(2);  // (kMhaPrefill only)
  // The fast path runs beside the reference path (which matches HF to ~4e-5) and both report
  // their routing: a step where the fast path sent the measured token (the step's last row) to
  // other experts than the reference path did, in any layer (a near-tied expert choice its
  // rounding flipped), measures that flip, not the kernels, and is left out (counted and
  // printed). Most steps must stay comparable, so a bug that changes routing fails instead of
  // hiding.
  DeepseekModel ref(cfg, (*ck)->weights(), dispatcher, &pool, mode, ComputePath::kReference);
  using Routes = std::vector<std::pair<int64_t, std::vector<int32_t>>>;
  Routes fast_routes, ref_routes;
  auto record = [k = cfg.num_experts_per_tok](Routes* out) {
    return [out, k](int64_t layer, std::span<const int32_t> ids) {
      std::vector<int32_t> last(ids.end() - k, ids.end());  // the step's last row, as a set
      std::sort(last.begin(), last.end());
      out->emplace_back(layer, std::move(last));
    };
  };
  if (fast()) {
    model.set_route_observer(record(&fast_routes));
    ref.set_route_observer(record(&ref_routes));
  }
  int64_t steps_total = 0, steps_flipped = 0;

  float worst = 0.0f;
  const float ref_tol = trained ? kTrainedLogprobTol : kLogprobTol;
  const float fast_bound = trained ? kTrainedFastBound : kFastBound;
  for (const Case& c : load_cases(name)) {
    const size_t n_steps = fast() ? c.steps.size() : comparable_steps(c);
    std::vector<int32_t> seq = c.prompt;
    for (const Step& s : c.steps) seq.push_back(s.token);
    std::vector<int32_t> table;
    for (int32_t b = 0; b * kKvBlockSize < int64_t(seq.size()); ++b) table.push_back(b);
    KvCache cache(kv_cache_layout(cfg, kv_dtype()), int32_t(table.size()));
    KvCache ref_cache(kv_cache_layout(cfg, DType::kF32), int32_t(table.size()));
    StepOutput out, ref_out;
    std::vector<float>& logits = out.logits;
    std::vector<float> lp(size_t(cfg.vocab_size));
    int64_t pos = 0, n_new = int64_t(c.prompt.size());
    for (size_t s = 0; s < n_steps; ++s) {
      StepSequence step{std::span<const int32_t>(seq).subspan(size_t(pos), size_t(n_new)), pos,
                        table, 1};
      fast_routes.clear();
      ref_routes.clear();
      ASSERT_TRUE(model.forward({&step, 1}, cache, &out).ok());
      bool flipped = false;
      if (fast()) {
        ASSERT_TRUE(ref.forward({&step, 1}, ref_cache, &ref_out).ok());
        flipped = fast_routes != ref_routes;
        ++steps_total;
        steps_flipped += flipped;
      }
      pos += n_new;
      n_new = 1;
      if (flipped) continue;
      log_softmax(logits.data(), cfg.vocab_size, lp.data());
      for (const TokenLogprob& t : c.steps[s].top) {
        float d = std::fabs(lp[size_t(t.id)] - t.logprob);
        worst = std::max(worst, d);
        if (!fast()) {
          EXPECT_LE(d, ref_tol) << name << " prompt len " << c.prompt.size() << " step " << s
                                << " token " << t.id;
        }
      }
      const float gap = c.steps[s].top[0].logprob - c.steps[s].top[1].logprob;
      if (!fast() && gap >= kNearTie) {
        EXPECT_EQ(argmax(logits.data(), cfg.vocab_size), c.steps[s].token)
            << name << " prompt len " << c.prompt.size() << " step " << s;
      }
    }
  }
  if (fast()) {
    EXPECT_LE(worst, fast_bound) << name;
    if (trained) EXPECT_EQ(steps_flipped, 0) << name << ": no step may be left out";
    EXPECT_LE(steps_flipped * 4, steps_total) << name << ": the measured token's routing differs"
                                              << " from the reference path in many steps";
  }
  std::printf("[ fixture %s, %s, %s ] max |dlogprob| = %.2e", name.c_str(), mode_name(mode),
              path == ComputePath::kFast ? "fast" : "reference", worst);
  if (fast()) {
    std::printf(" (%lld of %lld steps with the token's routing flipped, left out)",
                static_cast<long long>(steps_flipped), static_cast<long long>(steps_total));
  }
  std::printf("\n");
}

// Free-running greedy generation, all prompts in one batch: identical tokens up to the
// reference's first near tie (on the fast path, whose logprobs may each move by kFastBound, a
// top-2 gap under twice that counts as a tie: 0-7 steps per prompt on these fixtures, 21 in
// all; its logprobs are checked on every step by LogprobsAlongReferencePath).
TEST_P(HfReference, BatchedGreedyTokens) {
  auto [name, mode, path] = GetParam();
  const bool trained = is_trained(name);
  auto ck = Checkpoint::open(checkpoint_dir(name));
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& cfg = (*ck)->config();
  ThreadPool pool(2);
  LocalDispatcher dispatcher(cfg.n_routed_experts);
  DeepseekModel model(cfg, (*ck)->weights(), dispatcher, &pool, mode, path);
  model.set_mha_min_tokens(2);  // (kMhaPrefill only)
  KvCache cache(kv_cache_layout(cfg, kv_dtype()), 64);
  Generator gen(model, cache);

  std::vector<Case> cases = load_cases(name);
  std::vector<GenerateRequest> reqs;
  for (const Case& c : cases) {
    GenerateRequest r;
    r.prompt = c.prompt;
    r.max_tokens = int64_t(c.steps.size());
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  auto out = gen.generate(reqs);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  for (size_t i = 0; i < cases.size(); ++i) {
    const size_t n = trained ? cases[i].steps.size()
                             : comparable_steps(cases[i], fast() ? 2 * kFastBound : kNearTie);
    // Tokens must agree on every step before the first near tie (on that step they may not);
    // a trained fixture's prompts have no near tie, and every step must agree.
    const size_t must_match = n < cases[i].steps.size() ? n - 1 : n;
    size_t first_diff = 0;
    while (first_diff < n && (*out)[i].tokens[first_diff] == cases[i].steps[first_diff].token) {
      ++first_diff;
    }
    EXPECT_GE(first_diff, must_match) << name << " prompt " << i;
  }
}

std::string param_name(
    const ::testing::TestParamInfo<std::tuple<std::string, AttentionMode, ComputePath>>& info) {
  std::string name = std::get<0>(info.param);  // test names allow [A-Za-z0-9_]
  std::replace(name.begin(), name.end(), '-', '_');
  return name + "_" + mode_name(std::get<1>(info.param)) +
         (std::get<2>(info.param) == ComputePath::kFast ? "_fast" : "_reference");
}
INSTANTIATE_TEST_SUITE_P(Fixtures, HfReference,
                         ::testing::Combine(::testing::ValuesIn(fixture_names()),
                                            ::testing::Values(AttentionMode::kAbsorbed,
                                                              AttentionMode::kNaive),
                                            ::testing::ValuesIn(compute_paths())),
                         param_name);
// The MHA form of prefill exists on the fast path only.
INSTANTIATE_TEST_SUITE_P(MhaPrefill, HfReference,
                         ::testing::Combine(::testing::ValuesIn(fixture_names()),
                                            ::testing::Values(AttentionMode::kMhaPrefill),
                                            ::testing::Values(ComputePath::kFast)),
                         param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(HfReference);

// The opt-in INT8 GEMMs (--gemm-int8 --lm-head-int8: every projection and the lm_head as
// gemm_int8, docs/kernels-int8.md) on the trained fixtures, against transformers: teacher forcing
// along its greedy path, every logprob of its top-5 within kInt8Bound, and the argmax its token
// on every step whose top-2 gap exceeds kInt8TieGap. Measured on tiny-py (docs/kernels-int8.md):
// max 0.515, mean 0.026 (the FP8 -> BF16 path: 0.067, 0.003), one step of 120 with another
// argmax (top-2 gap under kInt8TieGap); held to 1.25x the measured max. A lost scale, a
// column or group off by one, or a sign slip moves logprobs by whole nats.
constexpr float kInt8Bound = 0.65f;
constexpr float kInt8TieGap = 0.25f;  // 102 of tiny-py's 120 steps have a wider top-2 gap
TEST(HfReferenceInt8, TrainedFixturesAlongTheReferencePath) {
  int fixtures = 0;
  for (const std::string& name : fixture_names()) {
    if (!is_trained(name)) continue;
    ++fixtures;
    auto ck = Checkpoint::open(checkpoint_dir(name));
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    const ModelConfig& cfg = (*ck)->config();
    ThreadPool pool(2);
    LocalDispatcher dispatcher(cfg.n_routed_experts);
    DeepseekModel model(cfg, (*ck)->weights(), dispatcher, &pool, AttentionMode::kAbsorbed,
                        ComputePath::kFast, /*overlap=*/true, /*progress=*/false,
                        WeightFormats{WeightFormat::kInt8, HeadFormat::kInt8, std::nullopt});
    float worst = 0;
    int64_t steps = 0, argmax_checked = 0;
    std::vector<float> lp(size_t(cfg.vocab_size));
    for (const Case& c : load_cases(name)) {
      std::vector<int32_t> seq = c.prompt;
      for (const Step& st : c.steps) seq.push_back(st.token);
      std::vector<int32_t> table;
      for (int32_t b = 0; b * kKvBlockSize < int64_t(seq.size()); ++b) table.push_back(b);
      KvCache cache(kv_cache_layout(cfg, DType::kBF16), int32_t(table.size()));
      StepOutput out;
      int64_t pos = 0, n_new = int64_t(c.prompt.size());
      for (size_t s = 0; s < c.steps.size(); ++s, ++steps) {
        StepSequence step{std::span<const int32_t>(seq).subspan(size_t(pos), size_t(n_new)), pos,
                          table, 1};
        ASSERT_TRUE(model.forward({&step, 1}, cache, &out).ok());
        pos += n_new;
        n_new = 1;
        log_softmax(out.logits.data(), cfg.vocab_size, lp.data());
        for (const TokenLogprob& t : c.steps[s].top) {
          const float d = std::fabs(lp[size_t(t.id)] - t.logprob);
          worst = std::max(worst, d);
          EXPECT_LE(d, kInt8Bound) << name << " step " << s << " token " << t.id;
        }
        if (c.steps[s].top[0].logprob - c.steps[s].top[1].logprob > kInt8TieGap) {
          ++argmax_checked;
          EXPECT_EQ(argmax(out.logits.data(), cfg.vocab_size), c.steps[s].token)
              << name << " step " << s;
        }
      }
    }
    EXPECT_GE(argmax_checked * 4, steps * 3) << name << ": most steps must check the argmax";
    std::printf("[ fixture %s, INT8 GEMMs ] max |dlogprob| = %.2e over %lld steps\n", name.c_str(),
                worst, static_cast<long long>(steps));
  }
  EXPECT_GE(fixtures, 1) << "no trained fixture (tiny-py)";
}

// The fast path's weight preparation (minutes for a 671B checkpoint) reports progress on stderr
// when asked, and stays quiet otherwise.
TEST(FastPathPreparation, ReportsProgressOnlyWhenAsked) {
  auto ck = Checkpoint::open("tests/data/hf/v3");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  ThreadPool pool(2);
  LocalDispatcher dispatcher((*ck)->config().n_routed_experts);
  for (bool progress : {false, true}) {
    ::testing::internal::CaptureStderr();
    DeepseekModel model((*ck)->config(), (*ck)->weights(), dispatcher, &pool,
                        AttentionMode::kAbsorbed, ComputePath::kFast, /*overlap=*/true, progress);
    const std::string err = ::testing::internal::GetCapturedStderr();
    if (progress) {
      EXPECT_EQ(err.rfind("\rpreparing weights: ", 0), 0u) << err;  // from the start, in place
      EXPECT_NE(err.find("\rpreparing weights: 100% ("), std::string::npos) << err;
      EXPECT_EQ(err.back(), '\n') << err;
    } else {
      EXPECT_EQ(err, "");
    }
  }
}

TEST(HfReferenceFixtures, AllThreeArePresentWithEnoughSteps) {
  auto names = fixture_names();
  for (const char* want : {"v2lite", "v3", "yarn", "tiny-py"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
  for (const auto& name : names) {
    for (const Case& c : load_cases(name)) {
      EXPECT_GE(c.steps.size(), is_trained(name) ? size_t(32) : kMinSteps) << name;
    }
  }
}

}  // namespace
}  // namespace moeserve
