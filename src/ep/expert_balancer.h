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
//                     it: either a synchronous ExpertSource (below), or an ExpertHost
//                     (set_expert_host), with which a rebalance starts a background migration
//                     (ep/expert_migration.h): end_step() then moves at most
//                     migrate_bytes_per_step bytes per sender per step and switches the
//                     placement after the step in which every rank agreed it has everything.
//                     Interval rebalances that fall during a migration are skipped.
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
#include "ep/expert_migration.h"
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
  // Online migration: most bytes of expert weights each rank sends per step.
  int64_t migrate_bytes_per_step = int64_t(16) << 20;
  bool log_migrations = false;  // rank 0 prints a line on stderr when a migration ends
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
  int64_t steps() const { return steps_; }

  // Rebalances from now on migrate weights through `host` (owned) in the background; nullptr
  // cancels a migration in flight (dropping what it installed) and goes back to ExpertSource.
  // Between two steps, on every rank alike.
  void set_expert_host(std::unique_ptr<ExpertHost> host);
  bool migrating() const { return migration_ != nullptr; }
  // One report per migration that ended (switched or cancelled), oldest first.
  const std::vector<MigrationReport>& migrations() const { return reports_; }

  // Collective, after each step on every rank. Returns true when a new placement was installed.
  Result<bool> end_step();
  // Collective: gathers the window, plans and installs now (whatever the interval); with an
  // ExpertHost it starts a migration instead (the switch comes with a later end_step(), or now
  // when nothing has to move). InvalidArgument while a migration is in flight.
  Status rebalance();

 private:
  ExpertBalancer(Communicator& comm, EpDispatcher& dispatcher, int32_t moe_layers,
                 const BalancerOptions& options, ExpertSource source);
  Status advance_migration();
  Status switch_to_pending();  // the migration is complete on every rank

  Communicator& comm_;
  EpDispatcher& dispatcher_;
  BalancerOptions options_;
  ExpertSource source_;
  int32_t moe_layers_;
  ExpertLoadCounter counter_;
  int64_t steps_ = 0;
  int64_t rebalances_ = 0;
  std::unique_ptr<ExpertHost> host_;
  std::unique_ptr<ExpertMigration> migration_;  // in flight, towards pending_
  std::optional<ExpertPlacement> pending_;
  int64_t planned_at_ = 0;  // the step the migration in flight was planned after
  std::vector<MigrationReport> reports_;
};

}  // namespace moeserve
