// ExpertPlacement: which ranks of an EP group hold each routed (logical) expert, in every MoE
// layer, and which copy (replica) a token's expert goes to.
//
// Three ways to build one:
//   contiguous()  one copy per expert, expert e on rank e / (E / R): DeepSeek's EP without EPLB;
//   from_table()  one copy per expert on any rank (tests; the ranks need not hold equal numbers);
//   from_plan()   an EPLB plan (eplb/placement.h): num_physical slots per MoE layer, slot s on rank
//                 s / slots_per_rank, each slot an exact copy of its logical expert; heavy experts
//                 have several slots (redundant experts) and the table differs per MoE layer.
// The first two give one table for every MoE layer (layers() == 1, per_layer() false, any layer
// index accepted); from_plan gives one table per MoE layer (layer must be < layers()).
//
// A rank holding two slots of one expert in a layer maps its weights once: rows for it are grouped
// under the logical expert (experts_on() lists each expert once), and the extra slot only gives
// that rank a larger share of the expert's tokens.
//
// Replica choice (route()): eplb::ReplicaRouter's shares (docs/eplb.md, "Choosing a replica"): a
// source rank that holds a copy of the expert keeps its tokens local; other ranks spread theirs
// over the copies so that each copy gets an equal part when traffic comes evenly from all ranks;
// `seq` (the source rank's running count of tokens for that expert in the call) picks the copy,
// so the choice is deterministic. Copies are exact, so the choice never changes results.
//
// MoE layer indices count MoE layers only (0 = the first MoE layer), as the statistics files do.
// Immutable after construction (copies share the routing table); any thread may read it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "eplb/placement.h"
#include "eplb/replica_router.h"

namespace moeserve {

class ExpertPlacement {
 public:
  // Requires n_experts % n_ranks == 0 (every rank holds the same number of experts).
  static Result<ExpertPlacement> contiguous(int64_t n_experts, int n_ranks);
  // rank_of[e] in [0, n_ranks) for every expert e.
  static Result<ExpertPlacement> from_table(std::vector<int32_t> rank_of, int n_ranks);
  // The plan's GPUs are the ranks; its layers are the MoE layers.
  static Result<ExpertPlacement> from_plan(const eplb::Placement& plan);

  int64_t n_experts() const { return n_experts_; }
  int n_ranks() const { return n_ranks_; }
  bool per_layer() const { return per_layer_; }
  int64_t layers() const { return layers_; }
  // Physical slots per layer (n_experts() without redundant experts).
  int64_t n_slots() const { return n_slots_; }
  // Whether `layer` names a table (any layer does when !per_layer()).
  bool valid_layer(int64_t layer) const { return layer >= 0 && (!per_layer_ || layer < layers_); }

  // Layer arguments below must be valid_layer(); experts in [0, n_experts()).
  bool holds(int64_t layer, int rank, int32_t expert) const {
    return local_[idx(table(layer), rank, expert)] >= 0;
  }
  // Whether `rank` holds `expert` in some layer (what a rank must be able to compute).
  bool holds_in_any_layer(int rank, int32_t expert) const;
  // Position of the expert among experts_on(layer, rank); requires holds().
  int64_t local_index(int64_t layer, int rank, int32_t expert) const {
    return local_[idx(table(layer), rank, expert)];
  }
  // Logical experts with a slot on `rank`, each once, ascending.
  const std::vector<int32_t>& experts_on(int64_t layer, int rank) const {
    return held_[size_t(table(layer)) * size_t(n_ranks_) + size_t(rank)];
  }
  // Number of slots (replicas) of `expert` in `layer` over the whole group (>= 1).
  int32_t replicas(int64_t layer, int32_t expert) const;
  // The rank that computes the seq-th token that `src_rank` routes to `expert` in `layer`.
  int route(int64_t layer, int32_t expert, int src_rank, uint64_t seq) const;
  // The only rank holding `expert`; requires every expert to have a single copy.
  int rank_of(int32_t expert) const;

 private:
  ExpertPlacement() = default;
  int64_t table(int64_t layer) const { return per_layer_ ? layer : 0; }
  size_t idx(int64_t table, int rank, int32_t expert) const {
    return (size_t(table) * size_t(n_ranks_) + size_t(rank)) * size_t(n_experts_) + size_t(expert);
  }
  // Fills held_/local_ from the rank of each slot (slots_rank[t][s]) and phy2log[t][s].
  void index(const std::vector<int32_t>& phy2log, const std::vector<int32_t>& slot_rank);

  int64_t n_experts_ = 0, n_slots_ = 0, layers_ = 1;
  int n_ranks_ = 0;
  bool per_layer_ = false;
  std::vector<int32_t> single_rank_;                   // [n_experts] (one-copy placements only)
  std::vector<std::vector<int32_t>> held_;             // [tables][ranks] experts held, ascending
  std::vector<int64_t> local_;                         // [tables][ranks][experts]; < 0: not held
  std::vector<uint8_t> any_layer_;                     // [ranks][experts] held in some layer
  std::shared_ptr<const eplb::ReplicaRouter> router_;  // from_plan only
};

}  // namespace moeserve
