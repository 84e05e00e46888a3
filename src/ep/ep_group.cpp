#include "ep/ep_group.h"

#include <fmt/format.h>

namespace moeserve {

Result<EpGroup> make_ep_group(std::unique_ptr<Communicator> comm, const EpGroupOptions& options,
                              int64_t n_routed_experts, int64_t hidden, int64_t top_k) {
  EpGroup g;
  g.comm = std::move(comm);
  Result<ExpertPlacement> placement =
      options.eplb_loads ? plan_placement(*options.eplb_loads, g.comm->size(), options.eplb)
                         : ExpertPlacement::contiguous(n_routed_experts, g.comm->size());
  if (!placement.ok()) return placement.status().with_context("expert parallelism");
  if (placement->n_experts() != n_routed_experts) {
    return InvalidArgument(fmt::format("EPLB loads are for {} experts, the model has {}",
                                       placement->n_experts(), n_routed_experts));
  }
  EpOptions eo;
  eo.dtype = options.dtype;
  eo.mode = options.mode;
  eo.bf16_rows = options.bf16_rows;
  eo.hidden = hidden;
  eo.top_k = top_k;
  eo.max_tokens_per_rank = options.max_tokens_per_rank;
  ASSIGN_OR_RETURN(g.dispatcher, EpDispatcher::create(*g.comm, std::move(*placement), eo));
  if (options.count_loads || options.eplb_loads || options.eplb.interval_steps > 0) {
    ASSIGN_OR_RETURN(g.balancer, ExpertBalancer::create(*g.comm, *g.dispatcher, options.moe_layers,
                                                        options.eplb));
  }
  return g;
}

Result<EpGroup> join_mpi_ep_group(const EpGroupOptions& options, int64_t n_routed_experts,
                                  int64_t hidden, int64_t top_k) {
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                   make_mpi_communicator(CommOptions{options.timeout}));
  return make_ep_group(std::move(comm), options, n_routed_experts, hidden, top_k);
}

Status report_expert_loads(EpGroup& ep, const std::string& stats_out) {
  if (!ep.balancer) return Internal("expert loads: the EP group counts no loads");
  ExpertLoadCounter& counter = ep.balancer->counter();
  counter.flush();
  ASSIGN_OR_RETURN(GroupLoads loads, counter.gather(*ep.comm));
  if (ep.comm->rank() != 0) return Status::Ok();
  if (!stats_out.empty()) RETURN_IF_ERROR(write_expert_stats(loads, stats_out));
  std::string per_layer;
  for (int32_t l = 0; l < loads.rank_rows.num_layers; ++l) {
    per_layer += fmt::format(" {:.3f}", rank_imbalance(loads.rank_rows, l));
  }
  fmt::print(stderr,
             "eplb: {} steps, {} slots per MoE layer on {} ranks; max/mean rows per rank: mean "
             "{:.3f}, per MoE layer{}\n",
             loads.steps, ep.dispatcher->placement().n_slots(), ep.comm->size(),
             mean_rank_imbalance(loads.rank_rows), per_layer);
  return Status::Ok();
}

}  // namespace moeserve
