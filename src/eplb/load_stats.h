// ExpertLoadStats: counts the tokens routed to each logical expert of each MoE layer, step by
// step, and keeps a moving window of the last `window_steps` steps: the load estimate the
// balancer plans from (docs/eplb.md, "Load statistics").
//
// The MoE layer calls add()/add_routed() during a step and end_step() once the step is done;
// window_totals() sums the steps in the window (integer token counts, which rebalance exactly
// like their average: the plan does not depend on the scale of the loads) and moving_average()
// divides by the steps in the window. seed() starts from saved totals (`--eplb-init`): they
// enter the window as one block worth the number of steps they were counted over, and leave it
// as one block when real steps need the room.
//
// The file written by write() (`--expert-stats-out`) is read back by read_load_file()
// (expert_loads.h):
//   {"format": "moeserve.expert_stats", "version": 1, "num_layers": L, "num_experts": E,
//    "window_steps": W, "steps": S, "tokens": [[...E integers...] x L]}
// where tokens are the window totals over the S (<= W) steps in the window.
//
// Not thread-safe: one instance per rank, used by the thread that runs the MoE layers.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "eplb/expert_loads.h"

namespace moeserve::eplb {

inline constexpr const char* kExpertStatsFormat = "moeserve.expert_stats";
inline constexpr int kExpertStatsVersion = 1;

class ExpertLoadStats {
 public:
  // Requires layers, experts and window_steps >= 1 (CHECKed: these come from validated config).
  ExpertLoadStats(int32_t num_layers, int32_t num_experts, int32_t window_steps);

  int32_t num_layers() const { return num_layers_; }
  int32_t num_experts() const { return num_experts_; }
  int32_t window_steps() const { return window_steps_; }

  // Counts `tokens` routed to `expert` in `layer` during the current step.
  void add(int32_t layer, int32_t expert, int64_t tokens = 1);
  // Counts one token per entry of `expert_ids` (the gate's top-k ids of a batch, any shape).
  void add_routed(int32_t layer, std::span<const int32_t> expert_ids);
  // Closes the current step: it enters the window and the oldest steps leave as needed.
  void end_step();

  // Prepends saved totals counted over `steps` steps (1..window_steps); replaces any earlier
  // seed. InvalidArgument if the shape differs or steps is out of range.
  Status seed(const ExpertLoads& totals, int64_t steps);

  // Steps in the window now (completed steps plus seeded ones), at most window_steps.
  int64_t steps_in_window() const { return steps_in_window_; }
  // Steps closed since construction (not counting seeded ones).
  int64_t steps_completed() const { return steps_completed_; }
  // Tokens per layer and expert summed over the window: [layers][experts].
  ExpertLoads window_totals() const;
  // window_totals() / steps_in_window(); all zero while the window is empty.
  ExpertLoads moving_average() const;

  // The stats file described above, as text and to a file.
  std::string to_json() const;
  Status write(const std::string& path) const;

 private:
  struct Block {
    int64_t steps;
    bool seeded;                  // the block seed() added
    std::vector<int64_t> tokens;  // [layers][experts]
  };
  size_t index(int32_t layer, int32_t expert) const {
    return size_t(layer) * num_experts_ + expert;
  }

  int32_t num_layers_, num_experts_, window_steps_;
  std::vector<int64_t> current_;  // [layers][experts], the open step
  std::deque<Block> window_;      // oldest first
  std::vector<int64_t> totals_;   // [layers][experts], sum of window_
  int64_t steps_in_window_ = 0;
  int64_t steps_completed_ = 0;
};

}  // namespace moeserve::eplb
