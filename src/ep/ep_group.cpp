#include "ep/ep_group.h"

#include <fmt/format.h>

namespace moeserve {

Result<EpGroup> join_mpi_ep_group(const EpGroupOptions& options, int64_t n_routed_experts,
                                  int64_t hidden, int64_t top_k) {
  EpGroup g;
  ASSIGN_OR_RETURN(g.comm, make_mpi_communicator(CommOptions{options.timeout}));
  Result<ExpertPlacement> placement = ExpertPlacement::contiguous(n_routed_experts, g.comm->size());
  if (!placement.ok()) return placement.status().with_context("expert parallelism");
  EpOptions eo;
  eo.dtype = options.dtype;
  eo.mode = options.mode;
  eo.hidden = hidden;
  eo.top_k = top_k;
  eo.max_tokens_per_rank = options.max_tokens_per_rank;
  ASSIGN_OR_RETURN(g.dispatcher, EpDispatcher::create(*g.comm, std::move(*placement), eo));
  return g;
}

}  // namespace moeserve
