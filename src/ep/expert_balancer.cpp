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
      counter_(moe_layers, int32_t(dispatcher.placement().n_experts()), comm.size(),
               options.window_steps) {
  dispatcher_.set_load_counter(&counter_);
}

ExpertBalancer::~ExpertBalancer() {
  dispatcher_.set_load_counter(nullptr);
}

Result<bool> ExpertBalancer::end_step() {
  counter_.end_step();
  ++steps_;
  if (options_.interval_steps == 0 || steps_ % options_.interval_steps != 0) return false;
  RETURN_IF_ERROR(rebalance());
  return true;
}

Status ExpertBalancer::rebalance() {
  counter_.flush();
  ASSIGN_OR_RETURN(GroupLoads loads, counter_.gather(comm_));
  ASSIGN_OR_RETURN(ExpertPlacement next, plan_placement(loads.tokens, comm_.size(), options_));
  if (source_) RETURN_IF_ERROR(source_(next).with_context("EPLB rebalance"));
  RETURN_IF_ERROR(dispatcher_.set_placement(std::move(next)));
  ++rebalances_;
  return Status::Ok();
}

}  // namespace moeserve
