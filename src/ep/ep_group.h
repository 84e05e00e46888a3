// EpGroup: what a command (generate, later serve) needs to run a model expert-parallel: this
// process's rank of the MPI world, the EpDispatcher over it, and optionally the EPLB runtime.
// The placement is contiguous (one copy per expert), or, with EpGroupOptions::eplb_loads
// (`--eplb-init FILE`), the EPLB plan of those loads with redundant experts, per MoE layer. The
// dispatcher's holds_layer_expert() is what LoadOptions::holds_layer_expert takes, so a rank maps
// only the experts of its own slots. Owned by the command; used by its step thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ep/communicator.h"
#include "ep/ep_dispatcher.h"
#include "ep/expert_balancer.h"
#include "eplb/expert_loads.h"

namespace moeserve {

struct EpGroupOptions {
  DispatchDType dtype = DispatchDType::kFp8;
  EpMode mode = EpMode::kNormal;
  std::chrono::milliseconds timeout{30000};  // a silent peer fails the step after this
  int64_t max_tokens_per_rank = 0;           // low-latency capacity (most tokens in one step)
  // EPLB: plan the initial placement from these loads ([moe layers][experts]) with
  // eplb.redundant_experts extra slots; without them, the contiguous placement.
  std::optional<eplb::ExpertLoads> eplb_loads;
  BalancerOptions eplb;
  // Count expert loads (an ExpertBalancer with eplb's window and interval); implied by eplb_loads
  // and by eplb.interval_steps > 0 (online rebalancing: the model's ExpertHost is attached later,
  // ExpertBalancer::set_expert_host).
  bool count_loads = false;
  int32_t moe_layers = 0;  // needed when counting or planning
  bool bf16_rows = false;  // EpOptions::bf16_rows (set for the fast compute path)
};

struct EpGroup {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<EpDispatcher> dispatcher;  // borrows *comm; destroyed before it
  std::unique_ptr<ExpertBalancer> balancer;  // borrows both; destroyed first; may be null
};

// Joins the MPI world (one rank of `mpirun -np R`, or a world of one without mpirun).
Result<EpGroup> join_mpi_ep_group(const EpGroupOptions& options, int64_t n_routed_experts,
                                  int64_t hidden, int64_t top_k);

// The same on a given communicator (in-process groups in tests; takes ownership).
Result<EpGroup> make_ep_group(std::unique_ptr<Communicator> comm, const EpGroupOptions& options,
                              int64_t n_routed_experts, int64_t hidden, int64_t top_k);

// After a run, on every rank (collective): gathers the group's expert loads (the balancer's
// counter); rank 0 writes them to stats_out when it is not empty (the file `moeserve eplb
// --loads` and --eplb-init read) and prints the balance per MoE layer on stderr. Needs a group
// made with count_loads (or EPLB).
Status report_expert_loads(EpGroup& ep, const std::string& stats_out);

}  // namespace moeserve
