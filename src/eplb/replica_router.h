// ReplicaRouter: which physical replica a token's logical expert goes to, for the MoE layer's
// dispatch (docs/eplb.md, "Choosing a replica").
//
// Built once per placement. For every (layer, logical expert e, source rank) it precomputes
// shares: how much of that rank's traffic to e goes to each replica of e. Shares are integers
// out of c = logcnt(e) per source rank, found by filling each replica to exactly G units of
// the G * c total (G = GPUs), in three passes that prefer locality:
//   1. a rank sends to replicas on itself, 2. then to replicas on its node, 3. then anywhere.
// When tokens for e come evenly from all ranks, every replica receives exactly 1/c of e's
// tokens (the split the planner assumed); a rank holding a replica with room keeps its tokens
// local, and traffic leaves a node only when the node's replicas are full.
// select() turns shares into a slot for the token_seq-th token: any c consecutive values of
// token_seq follow the shares exactly.
//
// Immutable after construction: share it across threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eplb/placement.h"

namespace moeserve::eplb {

struct ReplicaShare {
  int32_t slot;   // physical slot (its GPU is placement.gpu_of_slot(slot))
  int32_t units;  // out of logcnt(layer, expert) for the source rank; > 0
};

class ReplicaRouter {
 public:
  explicit ReplicaRouter(const Placement& placement);

  // The shares of `src_rank`'s tokens for `logical` in `layer`; units sum to logcnt.
  std::span<const ReplicaShare> shares(int32_t layer, int32_t logical, int32_t src_rank) const;

  // The slot for the token_seq-th token that src_rank routes to `logical` in `layer`. token_seq
  // should count the rank's tokens for this expert (0, 1, 2, ... within a step): then every c
  // consecutive tokens split exactly by the shares.
  int32_t select(int32_t layer, int32_t logical, int32_t src_rank, uint64_t token_seq) const;

  const Placement& placement() const { return placement_; }

 private:
  size_t key(int32_t layer, int32_t logical, int32_t src_rank) const {
    return (size_t(layer) * placement_.num_logical() + logical) * placement_.num_gpus() + src_rank;
  }

  Placement placement_;
  std::vector<uint32_t> offsets_;     // [layers * logical * gpus + 1] into shares_
  std::vector<ReplicaShare> shares_;  // grouped by key()
};

}  // namespace moeserve::eplb
