#include "eplb/placement.h"

#include <algorithm>

#include <fmt/format.h>

namespace moeserve::eplb {

const char* policy_name(Policy policy) {
  return policy == Policy::kHierarchical ? "hierarchical" : "global";
}

Result<Placement> Placement::create(Policy policy, int32_t num_layers, int32_t num_logical,
                                    int32_t num_physical, int32_t num_gpus, int32_t num_nodes,
                                    std::vector<int32_t> phy2log,
                                    std::vector<int32_t> replica_rank) {
  if (num_layers < 1 || num_logical < 1 || num_gpus < 1 || num_nodes < 1) {
    return InvalidArgument(fmt::format(
        "placement: layers ({}), logical experts ({}), GPUs ({}) and nodes ({}) must be >= 1",
        num_layers, num_logical, num_gpus, num_nodes));
  }
  if (num_physical < num_logical || num_physical % num_gpus != 0 || num_gpus % num_nodes != 0) {
    return InvalidArgument(fmt::format(
        "placement: {} slots for {} experts on {} GPUs in {} nodes: need slots >= experts, "
        "slots divisible by GPUs and GPUs by nodes",
        num_physical, num_logical, num_gpus, num_nodes));
  }
  const size_t n_phy = size_t(num_layers) * num_physical;
  if (phy2log.size() != n_phy || replica_rank.size() != n_phy) {
    return InvalidArgument(fmt::format("placement: phy2log/replica_rank hold {}/{} entries, not {}",
                                       phy2log.size(), replica_rank.size(), n_phy));
  }
  Placement p;
  p.policy_ = policy;
  p.num_layers_ = num_layers;
  p.num_logical_ = num_logical;
  p.num_physical_ = num_physical;
  p.num_gpus_ = num_gpus;
  p.num_nodes_ = num_nodes;
  p.logcnt_.assign(size_t(num_layers) * num_logical, 0);
  for (int32_t l = 0; l < num_layers; ++l) {
    for (int32_t s = 0; s < num_physical; ++s) {
      const int32_t e = phy2log[p.idx_phy(l, s)];
      if (e < 0 || e >= num_logical) {
        return InvalidArgument(
            fmt::format("placement: layer {} slot {} holds expert {} of {}", l, s, e, num_logical));
      }
      ++p.logcnt_[p.idx_log(l, e)];
    }
  }
  for (int32_t l = 0; l < num_layers; ++l) {
    for (int32_t e = 0; e < num_logical; ++e) {
      if (p.logcnt_[p.idx_log(l, e)] == 0) {
        return InvalidArgument(fmt::format("placement: layer {} expert {} has no slot", l, e));
      }
    }
  }
  p.max_replicas_ = *std::max_element(p.logcnt_.begin(), p.logcnt_.end());
  constexpr int32_t kUnset = -1;  // internal only: detects duplicate or missing ranks below
  p.log2phy_.assign(size_t(num_layers) * num_logical * p.max_replicas_, kUnset);
  for (int32_t l = 0; l < num_layers; ++l) {
    for (int32_t s = 0; s < num_physical; ++s) {
      const int32_t e = phy2log[p.idx_phy(l, s)];
      const int32_t r = replica_rank[p.idx_phy(l, s)];
      const int32_t cnt = p.logcnt_[p.idx_log(l, e)];
      int32_t* cell = &p.log2phy_[p.idx_log(l, e) * p.max_replicas_ + std::max(r, 0)];
      if (r < 0 || r >= cnt || *cell != kUnset) {
        return InvalidArgument(fmt::format(
            "placement: layer {} slot {}: replica rank {} of expert {} is out of 0..{} or repeated",
            l, s, r, e, cnt - 1));
      }
      *cell = s;
    }
  }
  p.phy2log_ = std::move(phy2log);
  p.replica_rank_ = std::move(replica_rank);
  return p;
}

}  // namespace moeserve::eplb
