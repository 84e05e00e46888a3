#include "ep/expert_placement.h"

#include <fmt/format.h>

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
  ExpertPlacement p;
  p.on_rank_.resize(size_t(n_ranks));
  p.local_index_.resize(rank_of.size());
  for (size_t e = 0; e < rank_of.size(); ++e) {
    int32_t r = rank_of[e];
    if (r < 0 || r >= n_ranks) {
      return InvalidArgument(
          fmt::format("placement: expert {} on rank {}, outside [0, {})", e, r, n_ranks));
    }
    p.local_index_[e] = int64_t(p.on_rank_[size_t(r)].size());
    p.on_rank_[size_t(r)].push_back(int32_t(e));
  }
  p.rank_of_ = std::move(rank_of);
  return p;
}

}  // namespace moeserve
