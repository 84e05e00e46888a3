// EPLB with the model: a small random checkpoint served by in-process EP groups (ranks as
// threads), each rank mapping only the experts of its own slots (per MoE layer).
//   - Tokens and logprobs are identical with EPLB on (redundant experts, per-layer placement)
//     and off, at R = 2 and 4: copies are exact and the combine order does not depend on which
//     rank computed a row.
//   - With a gate biased toward experts 0..3, the measured max/mean rows per rank after a
//     rebalance falls to within 10% of what the plan predicts.
//   - Online (--eplb-interval): generation goes on across migrations with the tokens and
//     logprobs of a run without EPLB; the placement changed; every expert a rank newly holds
//     was received from another rank (its checkpoint never mapped it); max/mean rows fell.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../model/test_models.h"
#include "engine/generator.h"
#include "ep/ep_group.h"
#include "eplb/gpu_load.h"
#include "model/checkpoint.h"
#include "model/deepseek.h"
#include "model/expert_store.h"

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

std::vector<GenerateRequest> rank_requests(int rank, int n_prompts, int64_t max_tokens = 6) {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < n_prompts; ++i) {
    GenerateRequest r;
    for (int t = 0; t < 20; ++t) r.prompt.push_back((t * 31 + rank * 173 + i * 59 + 7) % 997);
    r.max_tokens = max_tokens;
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
  const int32_t moe_layers = int32_t(config.num_moe_layers());
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
      KvCache cache(kv_cache_layout(config, DType::kBF16), 16);
      Generator gen(model, cache);
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

struct OnlineOutcome {
  Result<std::vector<GenerateResult>> results = Internal("not run");
  Result<GroupLoads> loads = Internal("not run");
  std::vector<MigrationReport> migrations;
  std::string errors;  // failed checks of the rank's experts
  bool placement_changed = false;
};

// Every rank generates its prompts with the balancer called after every step; interval 0: no
// EPLB (contiguous placement, loads counted). F32 dispatch; window of 3 steps.
std::vector<OnlineOutcome> run_online(const std::string& dir, int R, int64_t interval,
                                      int64_t bytes_per_step) {
  const ModelConfig config = *load_model_config(dir + "/config.json");
  const int32_t moe_layers = int32_t(config.num_moe_layers());
  auto comms = make_in_process_group(R, CommOptions{std::chrono::milliseconds(60000)});
  std::vector<OnlineOutcome> out(static_cast<size_t>(R));
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) {
    threads.emplace_back([&, r] {
      OnlineOutcome& o = out[size_t(r)];
      EpGroupOptions eo;
      eo.dtype = DispatchDType::kF32;
      eo.count_loads = true;
      eo.moe_layers = moe_layers;
      eo.eplb.redundant_experts = interval > 0 ? 8 : 0;
      eo.eplb.groups = int32_t(config.n_group);
      eo.eplb.window_steps = 3;
      eo.eplb.interval_steps = interval;
      eo.eplb.migrate_bytes_per_step = bytes_per_step;
      auto group = make_ep_group(std::move(comms[size_t(r)]), eo, config.n_routed_experts,
                                 config.hidden_size, config.num_experts_per_tok);
      if (!group.ok()) {
        o.results = group.status();
        return;
      }
      const ExpertPlacement initial = group->dispatcher->placement();
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
      ExpertBalancer& balancer = *group->balancer;
      if (interval > 0) balancer.set_expert_host(std::make_unique<ModelExpertHost>(model.experts()));
      KvCache cache(kv_cache_layout(config, DType::kBF16), 64);
      Generator gen(model, cache);
      gen.set_after_step([&] { return balancer.end_step().status(); });
      o.results = gen.generate(rank_requests(r, 3, 16));
      // Let a migration still in flight end (collective: every rank is in the same state).
      while (o.results.ok() && balancer.migrating()) {
        if (Status st = balancer.end_step().status(); !st.ok()) o.results = st;
      }
      balancer.counter().flush();
      o.loads = balancer.counter().gather(*group->comm);
      o.migrations = balancer.migrations();
      // The experts this rank holds now are exactly the final placement's; those it did not
      // hold at the start came over the network: its checkpoint never mapped them.
      const ExpertPlacement& final_p = group->dispatcher->placement();
      std::vector<int64_t> moe_to_layer;
      for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
        if (config.is_moe_layer(l)) moe_to_layer.push_back(l);
      }
      for (int32_t l = 0; l < moe_layers; ++l) {
        const MoeWeights& mw = *(*ck)->weights().layers[size_t(moe_to_layer[size_t(l)])].moe;
        for (int32_t e = 0; e < int32_t(config.n_routed_experts); ++e) {
          for (int p = 0; p < R; ++p)
            o.placement_changed |= initial.holds(l, p, e) != final_p.holds(l, p, e);
          const std::string at = fmt::format("layer {} expert {}: ", l, e);
          if (final_p.holds(l, r, e) != model.experts().has_expert(l, e)) o.errors += at + "held != placed; ";
          if (final_p.holds(l, r, e) && !initial.holds(l, r, e)) {
            if (!model.experts().expert_received(l, e)) o.errors += at + "not received; ";
            if (mw.experts[size_t(e)]) o.errors += at + "mapped from the checkpoint; ";
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(EplbModel, OnlineMigrationKeepsTokensExactAndBalances) {
  const std::string dir = skewed_model_dir();
  for (int R : {2, 4}) {
    auto off = run_online(dir, R, 0, 0);
    auto on = run_online(dir, R, /*interval=*/4, /*bytes_per_step=*/256 << 10);
    for (int r = 0; r < R; ++r) {
      const std::string where = fmt::format("R {} rank {}", R, r);
      ASSERT_TRUE(off[size_t(r)].results.ok()) << off[size_t(r)].results.status().to_string();
      ASSERT_TRUE(on[size_t(r)].results.ok()) << on[size_t(r)].results.status().to_string();
      const auto& a = *off[size_t(r)].results;
      const auto& b = *on[size_t(r)].results;
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].tokens, b[i].tokens) << where << " prompt " << i;
        ASSERT_EQ(a[i].top_logprobs.size(), b[i].top_logprobs.size());
        for (size_t s = 0; s < a[i].top_logprobs.size(); ++s) {
          for (size_t k = 0; k < a[i].top_logprobs[s].size(); ++k) {
            EXPECT_EQ(a[i].top_logprobs[s][k].id, b[i].top_logprobs[s][k].id);
            EXPECT_EQ(a[i].top_logprobs[s][k].logprob, b[i].top_logprobs[s][k].logprob)
                << where << " prompt " << i << " step " << s;
          }
        }
      }
      const OnlineOutcome& o = on[size_t(r)];
      EXPECT_EQ(o.errors, "") << where;
      EXPECT_TRUE(o.placement_changed) << where;
      ASSERT_FALSE(o.migrations.empty()) << where;
      const MigrationReport& m = o.migrations[0];
      EXPECT_TRUE(m.ok) << where;
      EXPECT_EQ(m.planned_at_step, 4);
      EXPECT_GE(m.steps, 2) << where << ": the weights move over several steps";
      EXPECT_GT(m.group_bytes, 0);
      std::printf(
          "%s: first migration %lld transfers, %lld bytes in the group, %lld steps; "
          "this rank sent %lld, received %lld bytes (%lld experts), dropped %lld\n",
          where.c_str(), (long long)m.transfers, (long long)m.group_bytes, (long long)m.steps,
          (long long)m.bytes_sent, (long long)m.bytes_received, (long long)m.experts_received,
          (long long)m.experts_dropped);
    }
    ASSERT_TRUE(off[0].loads.ok() && on[0].loads.ok());
    EXPECT_EQ(on[0].loads->tokens.tokens, off[0].loads->tokens.tokens) << "the same routing";
    for (int32_t l = 0; l < off[0].loads->rank_rows.num_layers; ++l) {
      const double before = rank_imbalance(off[0].loads->rank_rows, l);
      const double after = rank_imbalance(on[0].loads->rank_rows, l);
      std::printf(
          "R %d MoE layer %d: max/mean rows per rank (last 3 steps) %.3f without EPLB, "
          "%.3f after migration\n",
          R, l, before, after);
      EXPECT_LT(after, before) << "R " << R << " layer " << l;
    }
  }
}

}  // namespace
}  // namespace moeserve
