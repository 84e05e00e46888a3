// ExpertBalancer: the EPLB runtime of one rank of an EP group (docs/eplb.md, "Runtime"): owns
// the load counter that the rank's EpDispatcher feeds and computes placements from the group's
// loads with eplb::rebalance_experts; the placement itself lives in the dispatcher, which the
// balancer switches between two steps.
//
//   plan_placement()  loads -> EPLB plan (num_replicas = experts + redundant slots, GPUs = ranks)
//                     -> ExpertPlacement. Pure.
//   ExpertBalancer    create() attaches a counter to the dispatcher. end_step() is collective
//                     (every rank calls it after the same step); it closes the counting step and,
//                     every `interval_steps` steps, gathers the group's window loads, plans, and
//                     installs the new placement in the dispatcher before the next step. The
//                     caller must make sure this rank can compute the experts a placement gives
//                     it (ExpertSource below).
//
// Used by the rank's step thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "core/status.h"
#include "ep/communicator.h"
#include "ep/ep_dispatcher.h"
#include "ep/expert_load_counter.h"
#include "ep/expert_placement.h"
#include "eplb/expert_loads.h"
#include "eplb/rebalance.h"

namespace moeserve {

struct BalancerOptions {
  int32_t redundant_experts =
      0;               // slots per MoE layer beyond one per expert (R must divide the total)
  int32_t groups = 1;  // expert groups (the model's n_group)
  int32_t nodes = 1;   // nodes of the group (ranks per node = R / nodes)
  int32_t window_steps = 1000;  // moving window of the load statistics
  int64_t interval_steps = 0;   // rebalance every this many steps (0: never, static placement)
};

// The EPLB placement of `loads` ([moe layers][experts]) over n_ranks ranks.
Result<ExpertPlacement> plan_placement(const eplb::ExpertLoads& loads, int n_ranks,
                                       const BalancerOptions& options);
// The plan itself (for predicted loads: eplb::gpu_loads_after).
Result<eplb::Placement> plan(const eplb::ExpertLoads& loads, int n_ranks,
                             const BalancerOptions& options);

// Makes experts computable on this rank before a new placement is installed: called with the
// new placement; returns an error if some expert it gives this rank cannot be provided.
using ExpertSource = std::function<Status(const ExpertPlacement& next)>;

class ExpertBalancer {
 public:
  // Borrows comm and dispatcher (they must outlive it) and attaches its counter to the dispatcher.
  static Result<std::unique_ptr<ExpertBalancer>> create(Communicator& comm,
                                                        EpDispatcher& dispatcher,
                                                        int32_t moe_layers,
                                                        const BalancerOptions& options,
                                                        ExpertSource source = {});
  ~ExpertBalancer();

  ExpertLoadCounter& counter() { return counter_; }
  const BalancerOptions& options() const { return options_; }
  int64_t rebalances() const { return rebalances_; }

  // Collective, after each step on every rank. Returns true when a new placement was installed.
  Result<bool> end_step();
  // Collective: gathers the window, plans and installs now (whatever the interval).
  Status rebalance();

 private:
  ExpertBalancer(Communicator& comm, EpDispatcher& dispatcher, int32_t moe_layers,
                 const BalancerOptions& options, ExpertSource source);

  Communicator& comm_;
  EpDispatcher& dispatcher_;
  BalancerOptions options_;
  ExpertSource source_;
  ExpertLoadCounter counter_;
  int64_t steps_ = 0;
  int64_t rebalances_ = 0;
};

}  // namespace moeserve
