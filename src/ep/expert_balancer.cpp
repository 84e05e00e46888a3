#include "ep/expert_balancer.h"

#include <fmt/format.h>

namespace moeserve {

Result<eplb::Placement> plan(const eplb::ExpertLoads& loads, int n_ranks,
                             const BalancerOptions& options) {
  if (options.redundant_experts < 0) {
    return InvalidArgument("redundant experts must be >= 0");
  }
  eplb::RebalanceOptions ro;
  ro.num_replicas = loads.num_experts + options.redundant_experts;
  ro.num_groups = options.groups;
  ro.num_nodes = options.nodes;
  ro.num_gpus = n_ranks;
  if (ro.num_replicas % n_ranks != 0) {
    return InvalidArgument(fmt::format(
        "{} experts + {} redundant = {} slots per layer cannot be split evenly over {} ranks",
        loads.num_experts, options.redundant_experts, ro.num_replicas, n_ranks));
  }
  return eplb::rebalance_experts(loads, ro);
}

Result<ExpertPlacement> plan_placement(const eplb::ExpertLoads& loads, int n_ranks,
                                       const BalancerOptions& options) {
  ASSIGN_OR_RETURN(eplb::Placement p, plan(loads, n_ranks, options));
  return ExpertPlacement::from_plan(p);
}

Result<std::unique_ptr<ExpertBalancer>> ExpertBalancer::create(Communicator& comm,
                                                               EpDispatcher& dispatcher,
                                                               int32_t moe_layers,
                                                               const BalancerOptions& options,
                                                               ExpertSource source) {
  if (moe_layers < 1 || options.window_steps < 1 || options.interval_steps < 0) {
    return InvalidArgument(
        "EPLB needs >= 1 MoE layer, a window of >= 1 step and an interval >= 0 steps");
  }
  if (dispatcher.placement().per_layer() && dispatcher.placement().layers() != moe_layers) {
    return InvalidArgument(fmt::format("EPLB: the placement has {} layers, the model {} MoE layers",
                                       dispatcher.placement().layers(), moe_layers));
  }
  return std::unique_ptr<ExpertBalancer>(
      new ExpertBalancer(comm, dispatcher, moe_layers, options, std::move(source)));
}

ExpertBalancer::ExpertBalancer(Communicator& comm, EpDispatcher& dispatcher, int32_t moe_layers,
                               const BalancerOptions& options, ExpertSource source)
    : comm_(comm),
      dispatcher_(dispatcher),
      options_(options),
      source_(std::move(source)),
      moe_layers_(moe_layers),
      counter_(moe_layers, int32_t(dispatcher.placement().n_experts()), comm.size(),
               options.window_steps) {
  dispatcher_.set_load_counter(&counter_);
}

ExpertBalancer::~ExpertBalancer() {
  dispatcher_.set_load_counter(nullptr);
}

void ExpertBalancer::set_expert_host(std::unique_ptr<ExpertHost> host) {
  if (migration_) {
    migration_->cancel();
    reports_.push_back(migration_->report());
    migration_.reset();
    pending_.reset();
  }
  host_ = std::move(host);
}

Result<bool> ExpertBalancer::end_step() {
  counter_.end_step();
  ++steps_;
  const int64_t before = rebalances_;
  if (migration_) {
    RETURN_IF_ERROR(advance_migration());
  } else if (options_.interval_steps > 0 && steps_ % options_.interval_steps == 0) {
    RETURN_IF_ERROR(rebalance());
  }
  return rebalances_ != before;
}

Status ExpertBalancer::rebalance() {
  if (migration_) return InvalidArgument("EPLB: a migration is already in flight");
  counter_.flush();
  ASSIGN_OR_RETURN(GroupLoads loads, counter_.gather(comm_));
  ASSIGN_OR_RETURN(ExpertPlacement next, plan_placement(loads.tokens, comm_.size(), options_));
  if (!host_) {
    if (source_) RETURN_IF_ERROR(source_(next).with_context("EPLB rebalance"));
    RETURN_IF_ERROR(dispatcher_.set_placement(std::move(next)));
    ++rebalances_;
    return Status::Ok();
  }
  MigrationPlan mp = plan_migration(dispatcher_.placement(), next, moe_layers_);
  ASSIGN_OR_RETURN(migration_, ExpertMigration::start(comm_, *host_, std::move(mp),
                                                      options_.migrate_bytes_per_step));
  if (migration_->export_failed()) {  // decided alike on every rank: keep serving as before
    if (options_.log_migrations) {
      fmt::print(stderr, "eplb (rank {}): {}; the placement stays\n", comm_.rank(),
                 migration_->export_error().message());
    }
    migration_.reset();
    return Status::Ok();
  }
  pending_ = std::move(next);
  planned_at_ = steps_;
  if (migration_->steps() == 0) return switch_to_pending();
  return Status::Ok();
}

Status ExpertBalancer::advance_migration() {
  ASSIGN_OR_RETURN(ExpertMigration::Progress progress, migration_->advance());
  if (progress == ExpertMigration::Progress::kInFlight) return Status::Ok();
  if (progress == ExpertMigration::Progress::kFailed) {  // every rank keeps the old placement
    reports_.push_back(migration_->report());
    if (options_.log_migrations && comm_.rank() == 0) {
      fmt::print(stderr, "eplb: migration failed on some rank; the placement stays\n");
    }
    migration_.reset();
    pending_.reset();
    return Status::Ok();
  }
  return switch_to_pending();
}

Status ExpertBalancer::switch_to_pending() {
  RETURN_IF_ERROR(dispatcher_.set_placement(std::move(*pending_)));
  pending_.reset();
  migration_->finish();
  MigrationReport r = migration_->report();
  r.planned_at_step = planned_at_;
  r.switched_at_step = steps_;
  reports_.push_back(r);
  migration_.reset();
  ++rebalances_;
  if (options_.log_migrations && comm_.rank() == 0) {
    fmt::print(stderr,
               "eplb: new placement after step {} (planned after step {}): {} experts moved, "
               "{:.2f} MiB in the group over {} steps; rank 0 sent {:.2f} MiB, received {:.2f} "
               "MiB, spent {:.1f} ms (longest step {:.1f} ms)\n",
               r.switched_at_step, r.planned_at_step, r.transfers,
               double(r.group_bytes) / (1 << 20), r.steps, double(r.bytes_sent) / (1 << 20),
               double(r.bytes_received) / (1 << 20), r.seconds * 1e3, r.max_step_seconds * 1e3);
  }
  return Status::Ok();
}

}  // namespace moeserve
