// EPLB with the model: a small random checkpoint served by in-process EP groups (ranks as
// threads), each rank mapping only the experts of its own slots (per MoE layer).
//   - Tokens and logprobs are identical with EPLB on (redundant experts, per-layer placement)
//     and off, at R = 2 and 4: copies are exact and the combine order does not depend on which
//     rank computed a row.
//   - With a gate biased toward experts 0..3, the measured max/mean rows per rank after a
//     rebalance falls to within 10% of what the plan predicts.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "../model/test_models.h"
#include "cache/block_allocator.h"
#include "engine/generator.h"
#include "ep/ep_group.h"
#include "eplb/gpu_load.h"
#include "model/checkpoint.h"
#include "model/deepseek.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

// Adds `delta` to e_score_correction_bias[e] for e in [0, n_hot) in every MoE layer of the
// checkpoint at dir (in place): the noaux_tc gate then prefers those experts.
void bias_gate(const std::string& dir, int n_hot, float delta) {
  int patched = 0;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() != ".safetensors") continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    io.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    io.read(header.data(), std::streamsize(n));
    const auto j = nlohmann::json::parse(header);
    for (const auto& [name, t] : j.items()) {
      if (name.find("e_score_correction_bias") == std::string::npos) continue;
      ASSERT_EQ(t["dtype"], "F32");
      const uint64_t begin = 8 + n + t["data_offsets"][0].get<uint64_t>();
      for (int e = 0; e < n_hot; ++e) {
        float v = 0;
        io.seekg(std::streamoff(begin + 4 * uint64_t(e)));
        io.read(reinterpret_cast<char*>(&v), 4);
        v += delta;
        io.seekp(std::streamoff(begin + 4 * uint64_t(e)));
        io.write(reinterpret_cast<const char*>(&v), 4);
      }
      ++patched;
    }
  }
  ASSERT_GT(patched, 0);
}

std::string skewed_model_dir() {
  static const std::string dir = [] {
    std::string src = moeserve::testing::small_model_dir("eplb", "tiny");
    std::string dst = src + "_skewed";
    fs::remove_all(dst);
    fs::copy(src, dst);
    bias_gate(dst, 4, 0.6f);
    return dst;
  }();
  return dir;
}

std::vector<GenerateRequest> rank_requests(int rank, int n_prompts) {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < n_prompts; ++i) {
    GenerateRequest r;
    for (int t = 0; t < 20; ++t) r.prompt.push_back((t * 31 + rank * 173 + i * 59 + 7) % 997);
    r.max_tokens = 6;
    r.top_logprobs = 4;
    r.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

struct RankOutcome {
  Result<std::vector<GenerateResult>> results = Internal("not run");
  Result<GroupLoads> loads = Internal("not run");
};

// Every rank generates its own prompts (same lengths, so the same number of steps) in an
// in-process group of R; placement from `eplb_loads` when given, contiguous otherwise.
std::vector<RankOutcome> run_group(const std::string& dir, int R,
                                   std::optional<eplb::ExpertLoads> eplb_loads, int32_t redundant) {
  const ModelConfig config = *load_model_config(dir + "/config.json");
  int32_t moe_layers = 0;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) moe_layers += config.is_moe_layer(l);
  auto comms = make_in_process_group(R, CommOptions{std::chrono::milliseconds(60000)});
  std::vector<RankOutcome> out(static_cast<size_t>(R));
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) {
    threads.emplace_back([&, r] {
      RankOutcome& o = out[size_t(r)];
      EpGroupOptions eo;
      eo.dtype = DispatchDType::kFp8;
      eo.eplb_loads = eplb_loads;
      eo.eplb.redundant_experts = redundant;
      eo.eplb.groups = int32_t(config.n_group);
      eo.count_loads = true;
      eo.moe_layers = moe_layers;
      auto group = make_ep_group(std::move(comms[size_t(r)]), eo, config.n_routed_experts,
                                 config.hidden_size, config.num_experts_per_tok);
      if (!group.ok()) {
        o.results = group.status();
        return;
      }
      LoadOptions load;
      load.holds_layer_expert = [d = group->dispatcher.get()](int64_t l, int32_t e) {
        return d->holds_layer_expert(l, e);
      };
      auto ck = Checkpoint::open(dir, load);
      if (!ck.ok()) {
        o.results = ck.status();
        return;
      }
      DeepseekModel model((*ck)->config(), (*ck)->weights(), *group->dispatcher, nullptr,
                          AttentionMode::kAbsorbed, ComputePath::kFast);
      LatentKvCache cache(config.num_hidden_layers, config.kv_cache_dim(), 16, DType::kBF16);
      BlockAllocator blocks(16);
      Generator gen(model, cache, blocks);
      o.results = gen.generate(rank_requests(r, 3));
      group->balancer->counter().flush();
      o.loads = group->balancer->counter().gather(*group->comm);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(EplbModel, TokensAndLogprobsIdenticalWithEplbOnAndOff) {
  const std::string dir = skewed_model_dir();
  for (int R : {2, 4}) {
    auto off = run_group(dir, R, std::nullopt, 0);
    ASSERT_TRUE(off[0].loads.ok()) << off[0].loads.status().to_string();
    auto on = run_group(dir, R, off[0].loads->tokens, /*redundant=*/8);
    for (int r = 0; r < R; ++r) {
      ASSERT_TRUE(off[size_t(r)].results.ok()) << off[size_t(r)].results.status().to_string();
      ASSERT_TRUE(on[size_t(r)].results.ok()) << on[size_t(r)].results.status().to_string();
      const auto& a = *off[size_t(r)].results;
      const auto& b = *on[size_t(r)].results;
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].tokens, b[i].tokens) << "R " << R << " rank " << r << " prompt " << i;
        ASSERT_EQ(a[i].top_logprobs.size(), b[i].top_logprobs.size());
        for (size_t s = 0; s < a[i].top_logprobs.size(); ++s) {
          for (size_t k = 0; k < a[i].top_logprobs[s].size(); ++k) {
            EXPECT_EQ(a[i].top_logprobs[s][k].id, b[i].top_logprobs[s][k].id);
            EXPECT_EQ(a[i].top_logprobs[s][k].logprob, b[i].top_logprobs[s][k].logprob)
                << "R " << R << " rank " << r << " prompt " << i << " step " << s;
          }
        }
      }
    }
    ASSERT_TRUE(on[0].loads.ok());
    EXPECT_EQ(on[0].loads->tokens.tokens, off[0].loads->tokens.tokens)
        << "the same routing with EPLB on";
    EXPECT_NE(on[0].loads->rank_rows.tokens, off[0].loads->rank_rows.tokens)
        << "but other ranks computed the rows";
  }
}

TEST(EplbModel, BiasedGateBalancesToWhatThePlanPredicts) {
  const std::string dir = skewed_model_dir();
  const int R = 4;
  auto before = run_group(dir, R, std::nullopt, 0);
  ASSERT_TRUE(before[0].loads.ok()) << before[0].loads.status().to_string();
  const GroupLoads& b = *before[0].loads;
  BalancerOptions bo;
  bo.redundant_experts = 8;
  bo.groups = 4;
  auto plan = moeserve::plan(b.tokens, R, bo);
  ASSERT_TRUE(plan.ok());
  auto after = run_group(dir, R, b.tokens, bo.redundant_experts);
  ASSERT_TRUE(after[0].loads.ok()) << after[0].loads.status().to_string();
  const GroupLoads& a = *after[0].loads;
  for (int32_t l = 0; l < b.tokens.num_layers; ++l) {
    const double imb_before = rank_imbalance(b.rank_rows, l);
    const double predicted = eplb::summarize(eplb::gpu_loads_after(b.tokens, *plan, l)).imbalance();
    const double imb_after = rank_imbalance(a.rank_rows, l);
    std::printf("MoE layer %d: max/mean rows per rank %.3f before, %.3f after (plan: %.3f)\n", l,
                imb_before, imb_after, predicted);
    EXPECT_GT(imb_before, 1.3) << "the biased gate skews the load, layer " << l;
    EXPECT_LT(imb_after, imb_before) << "layer " << l;
    EXPECT_LE(imb_after, predicted * 1.10) << "layer " << l;
  }
}

}  // namespace
}  // namespace moeserve
