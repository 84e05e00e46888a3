// ExpertPlacement: which rank of an EP group holds each routed (logical) expert.
//
// For now one copy per expert: contiguous() puts expert e on rank e / (n_experts / R) as
// DeepSeek's EP does without EPLB; from_table() takes any assignment, which is where EPLB's
// placement plugs in (redundant replicas will extend this to several ranks per expert). Immutable
// after construction; any thread may read it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace moeserve {

class ExpertPlacement {
 public:
  // Requires n_experts % n_ranks == 0 (every rank holds the same number of experts).
  static Result<ExpertPlacement> contiguous(int64_t n_experts, int n_ranks);
  // rank_of[e] in [0, n_ranks) for every expert e.
  static Result<ExpertPlacement> from_table(std::vector<int32_t> rank_of, int n_ranks);

  int64_t n_experts() const { return int64_t(rank_of_.size()); }
  int n_ranks() const { return int(on_rank_.size()); }
  int rank_of(int32_t expert) const { return rank_of_[size_t(expert)]; }
  // Position of the expert among its rank's experts (ascending global ids).
  int64_t local_index(int32_t expert) const { return local_index_[size_t(expert)]; }
  // Global ids of the experts on `rank`, ascending.
  const std::vector<int32_t>& experts_on(int rank) const { return on_rank_[size_t(rank)]; }

 private:
  std::vector<int32_t> rank_of_;               // [n_experts]
  std::vector<int64_t> local_index_;           // [n_experts]
  std::vector<std::vector<int32_t>> on_rank_;  // [n_ranks][experts on that rank]
};

}  // namespace moeserve
