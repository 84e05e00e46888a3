// Placement: where the physical expert slots of every MoE layer live and which logical expert
// each holds; the output of the load balancer (rebalance.h) and the table the MoE layer routes
// by (replica_router.h).
//
// Slots are numbered 0..num_physical-1 per layer; GPU (rank) g holds slots
// [g * slots_per_gpu, (g + 1) * slots_per_gpu) and node n holds GPUs
// [n * gpus_per_node, (n + 1) * gpus_per_node). The names follow DeepSeek's eplb.py:
//   phy2log[l][p]   logical expert held by slot p;
//   logcnt[l][e]    number of replicas (slots) of logical expert e, always >= 1;
//   replicas(l, e)  the slots of e ordered by replica rank (log2phy[l][e][0..logcnt-1]).
// eplb.py pads log2phy to the largest logcnt with -1; here only the JSON writer does that, the
// accessors return exactly the logcnt slots. Immutable once built: share it across threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace moeserve::eplb {

enum class Policy {
  kHierarchical,  // groups packed to nodes, replicas made and packed within each node
  kGlobal,        // replicas made and packed over all GPUs regardless of groups
};
const char* policy_name(Policy policy);

class Placement {
 public:
  // Validates and indexes a plan. phy2log and replica_rank are [num_layers][num_physical]
  // row-major; for each layer and logical expert the ranks of its slots must be exactly
  // 0..count-1, every logical expert must have a slot, and num_physical must divide evenly
  // over GPUs and GPUs over nodes.
  static Result<Placement> create(Policy policy, int32_t num_layers, int32_t num_logical,
                                  int32_t num_physical, int32_t num_gpus, int32_t num_nodes,
                                  std::vector<int32_t> phy2log, std::vector<int32_t> replica_rank);

  Policy policy() const { return policy_; }
  int32_t num_layers() const { return num_layers_; }
  int32_t num_logical() const { return num_logical_; }
  int32_t num_physical() const { return num_physical_; }
  int32_t num_gpus() const { return num_gpus_; }
  int32_t num_nodes() const { return num_nodes_; }
  int32_t slots_per_gpu() const { return num_physical_ / num_gpus_; }
  int32_t gpus_per_node() const { return num_gpus_ / num_nodes_; }
  int32_t gpu_of_slot(int32_t slot) const { return slot / slots_per_gpu(); }
  int32_t node_of_gpu(int32_t gpu) const { return gpu / gpus_per_node(); }
  // Largest logcnt over all layers and experts (the width of eplb.py's log2phy).
  int32_t max_replicas() const { return max_replicas_; }

  int32_t phy2log(int32_t layer, int32_t slot) const { return phy2log_[idx_phy(layer, slot)]; }
  int32_t replica_rank(int32_t layer, int32_t slot) const {
    return replica_rank_[idx_phy(layer, slot)];
  }
  int32_t logcnt(int32_t layer, int32_t logical) const { return logcnt_[idx_log(layer, logical)]; }
  std::span<const int32_t> replicas(int32_t layer, int32_t logical) const {
    return {log2phy_.data() + idx_log(layer, logical) * max_replicas_,
            size_t(logcnt(layer, logical))};
  }
  std::span<const int32_t> phy2log_row(int32_t layer) const {
    return {phy2log_.data() + idx_phy(layer, 0), size_t(num_physical_)};
  }

 private:
  Placement() = default;
  size_t idx_phy(int32_t l, int32_t p) const { return size_t(l) * num_physical_ + p; }
  size_t idx_log(int32_t l, int32_t e) const { return size_t(l) * num_logical_ + e; }

  Policy policy_ = Policy::kGlobal;
  int32_t num_layers_ = 0, num_logical_ = 0, num_physical_ = 0, num_gpus_ = 1, num_nodes_ = 1;
  int32_t max_replicas_ = 0;
  std::vector<int32_t> phy2log_;       // [layers][physical]
  std::vector<int32_t> replica_rank_;  // [layers][physical]
  std::vector<int32_t> logcnt_;        // [layers][logical]
  std::vector<int32_t> log2phy_;       // [layers][logical][max_replicas]; tail past logcnt unused
};

}  // namespace moeserve::eplb
