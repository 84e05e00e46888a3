// `moeserve eplb`: compute an expert placement with DeepSeek's EPLB algorithm from a loads file
// and print it (docs/eplb.md).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "eplb/expert_loads.h"
#include "eplb/gpu_load.h"
#include "eplb/rebalance.h"

namespace moeserve::cli {
namespace {

struct EplbArgs {
  std::string loads_path;
  eplb::RebalanceOptions options;
  bool json = false;
};

nlohmann::ordered_json plan_json(const eplb::ExpertLoads& loads, const eplb::Placement& p,
                                 const eplb::RebalanceOptions& o) {
  using nlohmann::ordered_json;
  ordered_json phy2log = ordered_json::array(), log2phy = ordered_json::array(),
               logcnt = ordered_json::array(), balance = ordered_json::array();
  for (int32_t l = 0; l < p.num_layers(); ++l) {
    phy2log.push_back(std::vector<int32_t>(p.phy2log_row(l).begin(), p.phy2log_row(l).end()));
    ordered_json l2p = ordered_json::array(), cnt = ordered_json::array();
    for (int32_t e = 0; e < p.num_logical(); ++e) {
      // eplb.py's layout: [max_replicas] per expert, padded with -1 past logcnt.
      std::vector<int32_t> row(p.max_replicas(), -1);
      const auto slots = p.replicas(l, e);
      std::copy(slots.begin(), slots.end(), row.begin());
      l2p.push_back(row);
      cnt.push_back(p.logcnt(l, e));
    }
    log2phy.push_back(std::move(l2p));
    logcnt.push_back(std::move(cnt));
    const auto before = eplb::summarize(eplb::gpu_loads_before(loads, l, p.num_gpus()));
    const auto after = eplb::summarize(eplb::gpu_loads_after(loads, p, l));
    balance.push_back(
        {{"layer", l},
         {"before",
          {{"max", before.max}, {"mean", before.mean}, {"max_over_mean", before.imbalance()}}},
         {"after",
          {{"max", after.max}, {"mean", after.mean}, {"max_over_mean", after.imbalance()}}}});
  }
  ordered_json j;
  j["policy"] = eplb::policy_name(p.policy());
  j["num_layers"] = p.num_layers();
  j["num_logical_experts"] = p.num_logical();
  j["num_replicas"] = o.num_replicas;
  j["num_groups"] = o.num_groups;
  j["num_nodes"] = o.num_nodes;
  j["num_gpus"] = o.num_gpus;
  j["phy2log"] = std::move(phy2log);
  j["log2phy"] = std::move(log2phy);
  j["logcnt"] = std::move(logcnt);
  j["gpu_load"] = std::move(balance);
  return j;
}

void print_text(const eplb::ExpertLoads& loads, const eplb::Placement& p) {
  fmt::print(
      "policy {}: {} layers, {} logical experts -> {} slots on {} GPUs ({} per GPU), "
      "{} nodes\n",
      eplb::policy_name(p.policy()), p.num_layers(), p.num_logical(), p.num_physical(),
      p.num_gpus(), p.slots_per_gpu(), p.num_nodes());
  fmt::print("{:>5}  {:>15}  {:>14}  {:>12}\n", "layer", "before max/mean", "after max/mean",
             "mean/GPU");
  for (int32_t l = 0; l < p.num_layers(); ++l) {
    const auto before = eplb::summarize(eplb::gpu_loads_before(loads, l, p.num_gpus()));
    const auto after = eplb::summarize(eplb::gpu_loads_after(loads, p, l));
    fmt::print("{:>5}  {:>15.3f}  {:>14.3f}  {:>12.1f}\n", l, before.imbalance(), after.imbalance(),
               after.mean);
  }
  for (int32_t l = 0; l < p.num_layers(); ++l) {
    fmt::print("layer {} slots by GPU:", l);
    for (int32_t s = 0; s < p.num_physical(); ++s) {
      if (s % p.slots_per_gpu() == 0) fmt::print(" |");
      fmt::print(" {}", p.phy2log(l, s));
    }
    fmt::print("\n");
  }
}

int run_eplb(const EplbArgs& args) {
  auto file = eplb::read_load_file(args.loads_path);
  if (!file.ok()) {
    fmt::print(stderr, "moeserve eplb: {}\n", file.status().message());
    return 1;  // the file is missing or wrong: a runtime error, not a usage error
  }
  const eplb::ExpertLoads& loads = file->loads;
  auto placement = eplb::rebalance_experts(loads, args.options);
  if (!placement.ok()) {
    fmt::print(stderr, "moeserve eplb: {}\n", placement.status().message());
    return 2;
  }
  if (args.json) {
    fmt::print("{}\n", plan_json(loads, *placement, args.options).dump());
  } else {
    print_text(loads, *placement);
  }
  return 0;
}

}  // namespace

Subcommand add_eplb_command(CLI::App& parent) {
  auto args = std::make_shared<EplbArgs>();
  auto* app = parent.add_subcommand(
      "eplb", "Plan redundant experts and their placement on GPUs (DeepSeek's EPLB algorithm)");
  app->add_option("--loads", args->loads_path,
                  "expert loads: a JSON matrix [layers][experts] or an --expert-stats-out file")
      ->required();
  app->add_option("--replicas", args->options.num_replicas,
                  "physical expert slots per layer (a multiple of --gpus, >= experts)")
      ->required();
  app->add_option("--groups", args->options.num_groups, "expert groups (n_group)")->required();
  app->add_option("--nodes", args->options.num_nodes, "server nodes")->required();
  app->add_option("--gpus", args->options.num_gpus, "GPUs (EP ranks), a multiple of --nodes")
      ->required();
  app->add_flag("--json", args->json, "print the plan as JSON");
  return {app, [args] { return run_eplb(*args); }};
}

}  // namespace moeserve::cli
