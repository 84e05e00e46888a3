#include "ep/expert_placement.h"

#include <fmt/format.h>

#include "core/check.h"

namespace moeserve {

Result<ExpertPlacement> ExpertPlacement::contiguous(int64_t n_experts, int n_ranks) {
  if (n_ranks <= 0 || n_experts <= 0 || n_experts % n_ranks != 0) {
    return InvalidArgument(
        fmt::format("{} routed experts cannot be split evenly over {} ranks (EP needs a divisor)",
                    n_experts, n_ranks));
  }
  const int64_t per_rank = n_experts / n_ranks;
  std::vector<int32_t> rank_of(static_cast<size_t>(n_experts));
  for (int64_t e = 0; e < n_experts; ++e) rank_of[size_t(e)] = int32_t(e / per_rank);
  return from_table(std::move(rank_of), n_ranks);
}

Result<ExpertPlacement> ExpertPlacement::from_table(std::vector<int32_t> rank_of, int n_ranks) {
  if (n_ranks <= 0) return InvalidArgument("placement: need at least one rank");
  if (rank_of.empty()) return InvalidArgument("placement: no experts");
  std::vector<int32_t> phy2log(rank_of.size());
  for (size_t e = 0; e < rank_of.size(); ++e) {
    if (rank_of[e] < 0 || rank_of[e] >= n_ranks) {
      return InvalidArgument(
          fmt::format("placement: expert {} on rank {}, outside [0, {})", e, rank_of[e], n_ranks));
    }
    phy2log[e] = int32_t(e);  // slot e holds expert e
  }
  ExpertPlacement p;
  p.n_experts_ = p.n_slots_ = int64_t(rank_of.size());
  p.n_ranks_ = n_ranks;
  p.index(phy2log, rank_of);
  p.single_rank_ = std::move(rank_of);
  return p;
}

Result<ExpertPlacement> ExpertPlacement::from_plan(const eplb::Placement& plan) {
  ExpertPlacement p;
  p.n_experts_ = plan.num_logical();
  p.n_slots_ = plan.num_physical();
  p.n_ranks_ = plan.num_gpus();
  p.layers_ = plan.num_layers();
  p.per_layer_ = true;
  std::vector<int32_t> phy2log, slot_rank;
  for (int32_t l = 0; l < plan.num_layers(); ++l) {
    for (int32_t s = 0; s < plan.num_physical(); ++s) {
      phy2log.push_back(plan.phy2log(l, s));
      slot_rank.push_back(plan.gpu_of_slot(s));
    }
  }
  p.index(phy2log, slot_rank);
  p.router_ = std::make_shared<const eplb::ReplicaRouter>(plan);
  return p;
}

void ExpertPlacement::index(const std::vector<int32_t>& phy2log,
                            const std::vector<int32_t>& slot_rank) {
  const int64_t tables = per_layer_ ? layers_ : 1;
  local_.assign(size_t(tables) * size_t(n_ranks_) * size_t(n_experts_), -1);
  held_.assign(size_t(tables) * size_t(n_ranks_), {});
  any_layer_.assign(size_t(n_ranks_) * size_t(n_experts_), 0);
  for (int64_t t = 0; t < tables; ++t) {
    for (int64_t s = 0; s < n_slots_; ++s) {
      const int32_t e = phy2log[size_t(t * n_slots_ + s)];
      const int r = slot_rank[size_t(t * n_slots_ + s)];
      local_[idx(t, r, e)] = 0;  // marked; positions assigned below in ascending expert order
      any_layer_[size_t(r) * size_t(n_experts_) + size_t(e)] = 1;
    }
    for (int r = 0; r < n_ranks_; ++r) {
      std::vector<int32_t>& held = held_[size_t(t) * size_t(n_ranks_) + size_t(r)];
      for (int32_t e = 0; e < n_experts_; ++e) {
        if (local_[idx(t, r, e)] < 0) continue;
        local_[idx(t, r, e)] = int64_t(held.size());
        held.push_back(e);
      }
    }
  }
}

bool ExpertPlacement::holds_in_any_layer(int rank, int32_t expert) const {
  return any_layer_[size_t(rank) * size_t(n_experts_) + size_t(expert)] != 0;
}

int32_t ExpertPlacement::replicas(int64_t layer, int32_t expert) const {
  return router_ ? router_->placement().logcnt(int32_t(layer), expert) : 1;
}

int ExpertPlacement::route(int64_t layer, int32_t expert, int src_rank, uint64_t seq) const {
  if (!router_) return single_rank_[size_t(expert)];
  const int32_t slot = router_->select(int32_t(layer), expert, src_rank, seq);
  return router_->placement().gpu_of_slot(slot);
}

int ExpertPlacement::rank_of(int32_t expert) const {
  CHECK(!single_rank_.empty(), "rank_of() needs a placement with one copy of every expert");
  return single_rank_[size_t(expert)];
}

}  // namespace moeserve
