// ExpertLoadCounter: what one rank's MoE layers route, per MoE layer and step, over a moving
// window of steps (eplb::ExpertLoadStats, docs/eplb.md "Load statistics"). Two counts:
//   tokens  this rank's (token, expert) pairs per logical expert: summed over the ranks of the
//           group, the expert loads that EPLB plans from (the `--expert-stats-out` file);
//   sent    this rank's (token, expert) pairs per destination rank: summed over the source
//           ranks, the rows each rank's experts compute, i.e. each rank's load; max/mean over
//           ranks is the imbalance that EPLB reduces.
//
// EpDispatcher calls on_dispatch() for every dispatch (set_load_counter). Steps: whoever knows
// step boundaries calls end_step(); otherwise a step ends by itself when a dispatch comes for a
// lower MoE layer than the one before (the next forward pass began; with a single MoE layer,
// every dispatch begins a step). flush() closes the open step (before reading the counts at the
// end of a run).
//
// gather() is collective over the group (every rank calls it at the same point) and gives every
// rank the group's window totals. Not thread-safe: one per rank, used by its step thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"
#include "ep/communicator.h"
#include "eplb/expert_loads.h"
#include "eplb/load_stats.h"

namespace moeserve {

// The group's loads over the window (sums over ranks).
struct GroupLoads {
  eplb::ExpertLoads tokens;     // [moe layers][experts] tokens routed to each logical expert
  eplb::ExpertLoads rank_rows;  // [moe layers][ranks] rows each rank's experts computed
  int64_t steps = 0;            // steps in the window (the same on every rank)
  int32_t window_steps = 0;
};

// Max over ranks / mean over ranks of the rows of one layer (1 when there are none).
double rank_imbalance(const eplb::ExpertLoads& rank_rows, int32_t moe_layer);
// rank_imbalance averaged over the layers.
double mean_rank_imbalance(const eplb::ExpertLoads& rank_rows);

class ExpertLoadCounter {
 public:
  // Requires every argument >= 1 (CHECKed: they come from the validated config and group).
  ExpertLoadCounter(int32_t moe_layers, int32_t experts, int ranks, int32_t window_steps);

  // ids, dest: [n_tokens * top_k] expert ids and the rank each (token, expert) goes to.
  void on_dispatch(int64_t moe_layer, std::span<const int32_t> ids, std::span<const int32_t> dest);
  // Closes the open step, if any dispatch was counted since the last one.
  void end_step();
  void flush() { end_step(); }

  const eplb::ExpertLoadStats& tokens() const { return tokens_; }
  const eplb::ExpertLoadStats& sent() const { return sent_; }
  int64_t steps_completed() const { return tokens_.steps_completed(); }

  // Collective: the group's window totals (tokens summed over ranks, rows per destination rank
  // summed over sources). Only closed steps count.
  Result<GroupLoads> gather(Communicator& comm) const;

 private:
  eplb::ExpertLoadStats tokens_;  // [layers][experts]
  eplb::ExpertLoadStats sent_;    // [layers][ranks]
  int64_t last_layer_ = 0;
  bool open_ = false;  // a dispatch was counted since the last end_step
};

// Writes the group's expert loads in the statistics format that `moeserve eplb --loads` and
// `--eplb-init` read (eplb/load_stats.h). InvalidArgument when there is no closed step.
Status write_expert_stats(const GroupLoads& loads, const std::string& path);

}  // namespace moeserve
