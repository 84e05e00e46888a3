#include "ep/expert_load_counter.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "core/check.h"

namespace moeserve {

double rank_imbalance(const eplb::ExpertLoads& rank_rows, int32_t moe_layer) {
  const std::span<const double> rows = rank_rows.layer(moe_layer);
  double total = 0, max = 0;
  for (double v : rows) {
    total += v;
    max = std::max(max, v);
  }
  return total > 0 ? max / (total / double(rows.size())) : 1.0;
}

double mean_rank_imbalance(const eplb::ExpertLoads& rank_rows) {
  double sum = 0;
  for (int32_t l = 0; l < rank_rows.num_layers; ++l) sum += rank_imbalance(rank_rows, l);
  return rank_rows.num_layers > 0 ? sum / rank_rows.num_layers : 1.0;
}

ExpertLoadCounter::ExpertLoadCounter(int32_t moe_layers, int32_t experts, int ranks,
                                     int32_t window_steps)
    : tokens_(moe_layers, experts, window_steps), sent_(moe_layers, ranks, window_steps) {}

void ExpertLoadCounter::on_dispatch(int64_t moe_layer, std::span<const int32_t> ids,
                                    std::span<const int32_t> dest) {
  CHECK(ids.size() == dest.size(), "one destination per (token, expert)");
  CHECK(moe_layer >= 0 && moe_layer < tokens_.num_layers(), "MoE layer within the counter");
  const bool new_step = moe_layer < last_layer_ || tokens_.num_layers() == 1;
  if (open_ && new_step) end_step();
  last_layer_ = moe_layer;
  open_ = true;
  const int32_t l = int32_t(moe_layer);
  tokens_.add_routed(l, ids);
  for (int32_t r : dest) sent_.add(l, r, 1);
}

void ExpertLoadCounter::end_step() {
  if (!open_) return;
  tokens_.end_step();
  sent_.end_step();
  open_ = false;
  last_layer_ = 0;
}

namespace {

// Sums [rank][n] int64 rows gathered from every rank into an ExpertLoads of shape [layers][cols].
Result<eplb::ExpertLoads> sum_over_ranks(Communicator& comm, const eplb::ExpertLoads& mine) {
  std::vector<int64_t> local(mine.tokens.size());
  for (size_t i = 0; i < local.size(); ++i) local[i] = std::llround(mine.tokens[i]);
  std::vector<int64_t> all(local.size() * size_t(comm.size()));
  RETURN_IF_ERROR(comm.all_gather(local, all).with_context("expert load statistics"));
  eplb::ExpertLoads out(mine.num_layers, mine.num_experts);
  for (int r = 0; r < comm.size(); ++r) {
    for (size_t i = 0; i < local.size(); ++i) {
      out.tokens[i] += double(all[size_t(r) * local.size() + i]);
    }
  }
  return out;
}

}  // namespace

Result<GroupLoads> ExpertLoadCounter::gather(Communicator& comm) const {
  if (sent_.num_experts() != comm.size()) {
    return InvalidArgument(fmt::format("expert load counter is for {} ranks, the group has {}",
                                       sent_.num_experts(), comm.size()));
  }
  GroupLoads g;
  ASSIGN_OR_RETURN(g.tokens, sum_over_ranks(comm, tokens_.window_totals()));
  ASSIGN_OR_RETURN(g.rank_rows, sum_over_ranks(comm, sent_.window_totals()));
  g.steps = tokens_.steps_in_window();
  g.window_steps = tokens_.window_steps();
  return g;
}

Status write_expert_stats(const GroupLoads& loads, const std::string& path) {
  if (loads.steps < 1) {
    return InvalidArgument(
        fmt::format("{}: no completed step to write expert statistics of", path));
  }
  eplb::ExpertLoadStats stats(loads.tokens.num_layers, loads.tokens.num_experts,
                              loads.window_steps);
  RETURN_IF_ERROR(stats.seed(loads.tokens, loads.steps));
  return stats.write(path);
}

}  // namespace moeserve
