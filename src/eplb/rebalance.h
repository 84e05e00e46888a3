// The expert-parallel load balancer: DeepSeek's EPLB (github.com/deepseek-ai/EPLB, eplb.py),
// re-implemented so that its plans match the Python original exactly, ties included
// (docs/eplb.md explains the algorithm, the tie rules and where exactness ends).
//
// rebalance_experts picks the policy as eplb.py does: hierarchical when num_groups is a multiple
// of num_nodes (pack expert groups to nodes, replicate experts within each node, pack the
// replicas to the node's GPUs), otherwise global (the same procedure with one group and one
// node). Loads are converted to float32 and all arithmetic runs in float32, as eplb.py's
// `weight.float()` does. Pure functions, callable from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "eplb/expert_loads.h"
#include "eplb/placement.h"

namespace moeserve::eplb {

struct RebalanceOptions {
  int32_t num_replicas = 0;  // physical slots per layer, a multiple of num_gpus, >= experts
  int32_t num_groups = 1;    // expert groups (DeepSeek-V3: n_group = 8)
  int32_t num_nodes = 1;     // nodes; num_gpus must be a multiple of it
  int32_t num_gpus = 1;      // GPUs (EP ranks) in all
};

// The policy rebalance_experts will use for these options.
Policy policy_for(const RebalanceOptions& options);

// Computes the placement for `loads` ([layers][experts]); InvalidArgument when the shape
// options do not fit (each message says which constraint failed).
Result<Placement> rebalance_experts(const ExpertLoads& loads, const RebalanceOptions& options);

// The steps of eplb.py, one layer (row) at a time; exposed for tests.

// Assigns n items to num_packs packs of exactly n / num_packs items (n must be a multiple):
// heaviest first (torch_sort_descending), each to the lightest pack with room, lowest pack index
// among equals. pack[i] is item i's pack, rank_in_pack[i] its position in that pack.
struct Packing {
  std::vector<int32_t> pack;
  std::vector<int32_t> rank_in_pack;
};
Packing balanced_packing(std::span<const float> weight, int32_t num_packs);

// Replicates num_log = weight.size() experts into num_physical >= num_log slots: slot i < num_log
// holds expert i; each further slot goes to the expert with the largest weight / replicas
// (torch_argmax: lowest index among equals). replica_rank[slot] counts earlier slots of the same
// expert; logcnt[e] is the number of slots of e.
struct Replication {
  std::vector<int32_t> phy2log;
  std::vector<int32_t> replica_rank;
  std::vector<int32_t> logcnt;
};
Replication replicate_experts(std::span<const float> weight, int32_t num_physical);

}  // namespace moeserve::eplb
