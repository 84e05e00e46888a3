// EpGroup: what a command (generate, later serve) needs to run a model expert-parallel: this
// process's rank of the MPI world and the EpDispatcher over it, with the contiguous placement.
// The dispatcher's holds_expert() is what LoadOptions::holds_expert takes, so a rank maps only its
// own routed experts. Owned by the command; used by its step thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "ep/communicator.h"
#include "ep/ep_dispatcher.h"

namespace moeserve {

struct EpGroupOptions {
  DispatchDType dtype = DispatchDType::kFp8;
  EpMode mode = EpMode::kNormal;
  std::chrono::milliseconds timeout{30000};  // a silent peer fails the step after this
  int64_t max_tokens_per_rank = 0;           // low-latency capacity (most tokens in one step)
};

struct EpGroup {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<EpDispatcher> dispatcher;  // borrows *comm; destroyed first
};

// Joins the MPI world (one rank of `mpirun -np R`, or a world of one without mpirun).
Result<EpGroup> join_mpi_ep_group(const EpGroupOptions& options, int64_t n_routed_experts,
                                  int64_t hidden, int64_t top_k);

}  // namespace moeserve
