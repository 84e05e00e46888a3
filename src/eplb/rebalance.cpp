#include "eplb/rebalance.h"

#include <cmath>

#include <fmt/format.h>

#include "core/check.h"
#include "eplb/torch_order.h"

namespace moeserve::eplb {

Packing balanced_packing(std::span<const float> weight, int32_t num_packs) {
  const int32_t n = static_cast<int32_t>(weight.size());
  CHECK(num_packs >= 1 && n % num_packs == 0, "items must divide evenly into packs");
  const int32_t per_pack = n / num_packs;
  Packing out{std::vector<int32_t>(n), std::vector<int32_t>(n, 0)};
  if (per_pack == 1) {  // eplb.py short-cuts this case: item i goes to pack i, unsorted
    for (int32_t i = 0; i < n; ++i) out.pack[i] = i;
    return out;
  }
  std::vector<float> pack_load(num_packs, 0.0f);  // float32 sums, as the tensors in eplb.py
  std::vector<int32_t> pack_items(num_packs, 0);
  for (int32_t item : torch_sort_descending(weight)) {
    int32_t best = -1;
    for (int32_t p = 0; p < num_packs; ++p) {
      if (pack_items[p] < per_pack && (best < 0 || pack_load[p] < pack_load[best])) best = p;
    }
    CHECK(best >= 0, "a pack with room exists while items remain");
    out.pack[item] = best;
    out.rank_in_pack[item] = pack_items[best];
    pack_load[best] += weight[item];
    ++pack_items[best];
  }
  return out;
}

Replication replicate_experts(std::span<const float> weight, int32_t num_physical) {
  const int32_t num_log = static_cast<int32_t>(weight.size());
  CHECK(num_log >= 1 && num_physical >= num_log, "at least one slot per expert");
  Replication out{std::vector<int32_t>(num_physical), std::vector<int32_t>(num_physical, 0),
                  std::vector<int32_t>(num_log, 1)};
  for (int32_t i = 0; i < num_log; ++i) out.phy2log[i] = i;
  std::vector<float> per_replica(weight.begin(), weight.end());  // weight / logcnt, float32
  for (int32_t slot = num_log; slot < num_physical; ++slot) {
    const int32_t e = torch_argmax(per_replica);
    out.phy2log[slot] = e;
    out.replica_rank[slot] = out.logcnt[e];
    ++out.logcnt[e];
    per_replica[e] = weight[e] / static_cast<float>(out.logcnt[e]);
  }
  return out;
}

Policy policy_for(const RebalanceOptions& o) {
  return o.num_nodes > 0 && o.num_groups % o.num_nodes == 0 ? Policy::kHierarchical
                                                            : Policy::kGlobal;
}

namespace {

Status validate(const ExpertLoads& loads, const RebalanceOptions& o) {
  const int32_t E = loads.num_experts;
  if (loads.num_layers < 1 || E < 1 || loads.tokens.size() != size_t(loads.num_layers) * E) {
    return InvalidArgument(fmt::format("eplb: loads must be a non-empty [layers][experts] matrix"));
  }
  if (o.num_replicas < 1 || o.num_groups < 1 || o.num_nodes < 1 || o.num_gpus < 1) {
    return InvalidArgument(
        fmt::format("eplb: replicas ({}), groups ({}), nodes ({}) and GPUs ({}) must be >= 1",
                    o.num_replicas, o.num_groups, o.num_nodes, o.num_gpus));
  }
  if (o.num_gpus % o.num_nodes != 0) {
    return InvalidArgument(
        fmt::format("eplb: {} GPUs do not divide evenly over {} nodes", o.num_gpus, o.num_nodes));
  }
  if (o.num_replicas % o.num_gpus != 0) {
    return InvalidArgument(fmt::format("eplb: {} replicas do not divide evenly over {} GPUs",
                                       o.num_replicas, o.num_gpus));
  }
  if (o.num_replicas < E) {
    return InvalidArgument(
        fmt::format("eplb: {} replicas cannot hold {} experts", o.num_replicas, E));
  }
  if (policy_for(o) == Policy::kHierarchical && E % o.num_groups != 0) {
    return InvalidArgument(
        fmt::format("eplb: {} experts do not split into {} equal groups", E, o.num_groups));
  }
  for (size_t i = 0; i < loads.tokens.size(); ++i) {
    const float w = static_cast<float>(loads.tokens[i]);
    if (!std::isfinite(w) || w < 0) {
      return InvalidArgument(
          fmt::format("eplb: load of layer {} expert {} is {}; loads must be "
                      "finite, >= 0 and within float32 range",
                      i / E, i % E, loads.tokens[i]));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<Placement> rebalance_experts(const ExpertLoads& loads, const RebalanceOptions& options) {
  RETURN_IF_ERROR(validate(loads, options));
  const Policy policy = policy_for(options);
  // The global policy is the hierarchical one with a single group on a single node.
  const int32_t groups = policy == Policy::kHierarchical ? options.num_groups : 1;
  const int32_t nodes = policy == Policy::kHierarchical ? options.num_nodes : 1;
  const int32_t L = loads.num_layers, E = loads.num_experts, P = options.num_replicas;
  const int32_t G = options.num_gpus;
  const int32_t group_size = E / groups, groups_per_node = groups / nodes;
  const int32_t log_per_node = E / nodes, phy_per_node = P / nodes, slots_per_gpu = P / G;

  std::vector<int32_t> phy2log(size_t(L) * P), replica_rank(size_t(L) * P);
  std::vector<float> w(E);
  for (int32_t l = 0; l < L; ++l) {
    for (int32_t e = 0; e < E; ++e) w[e] = static_cast<float>(loads.at(l, e));

    // 1. Pack groups to nodes. "mlog" numbers the logical experts node by node: node n holds
    //    mlog [n * log_per_node, (n + 1) * log_per_node).
    std::vector<float> group_load(groups, 0.0f);  // [groups]
    for (int32_t g = 0; g < groups; ++g) {
      for (int32_t j = 0; j < group_size; ++j) group_load[g] += w[g * group_size + j];
    }
    const Packing gp = balanced_packing(group_load, nodes);
    std::vector<int32_t> mlog2log(E);  // [E]
    for (int32_t g = 0; g < groups; ++g) {
      const int32_t base = (gp.pack[g] * groups_per_node + gp.rank_in_pack[g]) * group_size;
      for (int32_t j = 0; j < group_size; ++j) mlog2log[base + j] = g * group_size + j;
    }

    for (int32_t n = 0; n < nodes; ++n) {
      // 2. Replicate the node's experts into its phy_per_node slots.
      std::vector<float> mlog_load(log_per_node);  // [log_per_node]
      for (int32_t i = 0; i < log_per_node; ++i) mlog_load[i] = w[mlog2log[n * log_per_node + i]];
      const Replication rep = replicate_experts(mlog_load, phy_per_node);

      // 3. Pack the replicas (each carrying its expert's load / replicas) to the node's GPUs.
      std::vector<float> phy_load(phy_per_node);  // [phy_per_node]
      for (int32_t k = 0; k < phy_per_node; ++k) {
        const int32_t m = rep.phy2log[k];
        phy_load[k] = mlog_load[m] / static_cast<float>(rep.logcnt[m]);
      }
      const Packing pp = balanced_packing(phy_load, G / nodes);
      for (int32_t k = 0; k < phy_per_node; ++k) {
        const int32_t slot = n * phy_per_node + pp.pack[k] * slots_per_gpu + pp.rank_in_pack[k];
        phy2log[size_t(l) * P + slot] = mlog2log[n * log_per_node + rep.phy2log[k]];
        replica_rank[size_t(l) * P + slot] = rep.replica_rank[k];
      }
    }
  }
  auto placement = Placement::create(policy, L, E, P, G, options.num_nodes, std::move(phy2log),
                                     std::move(replica_rank));
  CHECK(placement.ok(), "rebalance_experts built an inconsistent placement");
  return placement;
}

}  // namespace moeserve::eplb
