// ExpertMigration: moves routed experts' weights between the ranks of an EP group when the EPLB
// placement changes (`--eplb-interval`, docs/eplb.md "Online rebalancing"), a bounded number of
// bytes per step, while the group keeps serving with the old placement.
//
//   ExpertHost      what a rank's model offers the migration: the bytes of an expert it holds,
//                   and installing or dropping an expert between two steps (model/expert_store.h
//                   implements it over a model's ExpertStore, V3's and V4's).
//   ExpertBlob      an expert's bytes as a list of spans, not copied (they point into the
//                   checkpoint mapping or an installed buffer, which `keep` holds alive).
//   plan_migration  pure and deterministic (every rank computes the same plan from the same two
//                   placements): one transfer per (moe layer, expert, rank) that `next` gives the
//                   rank and `current` does not, sent by a rank that holds the expert in
//                   `current` (the one with the fewest transfers so far; lowest rank among
//                   equals); and each rank's drops (held in `current`, not in `next`).
//   ExpertMigration one migration in flight on one rank.
//                   start()    collective: exports this rank's outgoing experts and all-gathers
//                              their sizes (one int64 per transfer), so every rank knows every
//                              byte's step. Each sender's outgoing experts form one stream (plan
//                              order); step t carries bytes [t B, (t + 1) B) of it, B =
//                              bytes_per_step, split by destination.
//                   advance()  collective, once per step: one all_to_all_v with that step's
//                              chunks, then installs the experts whose last byte arrived (they
//                              are not routed to before the switch, so installing early is
//                              harmless). On the last step an all-gather of one flag per rank is
//                              the agreement: kDone when every rank installed everything,
//                              kFailed otherwise (every rank then drops what it installed and
//                              the group keeps the old placement).
//                   finish()   after the caller switched to `next`: drops this rank's experts
//                              that `next` no longer gives it.
//                   cancel()   drops what this migration installed (not collective).
//
// Used by the rank's step thread only (the Communicator's one thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "ep/communicator.h"
#include "ep/expert_placement.h"

namespace moeserve {

struct ExpertBlob {
  std::vector<std::span<const uint8_t>> parts;  // the bytes, in order
  std::shared_ptr<const void> keep;             // keeps the memory of `parts` alive
  size_t size() const;
  // Copies bytes [offset, offset + n) of the concatenated parts to dst.
  void copy(size_t offset, size_t n, uint8_t* dst) const;
};

class ExpertHost {
 public:
  virtual ~ExpertHost() = default;
  // The bytes of an expert this rank can compute (NotFound otherwise).
  virtual Result<ExpertBlob> export_expert(int64_t moe_layer, int32_t expert) = 0;
  // Makes the expert computable from bytes another rank exported; the error names what is wrong
  // with them.
  virtual Status install_expert(int64_t moe_layer, int32_t expert, std::vector<uint8_t> bytes) = 0;
  // Releases the expert's weights (a no-op when it holds none).
  virtual void drop_expert(int64_t moe_layer, int32_t expert) = 0;
};

struct ExpertTransfer {
  int64_t moe_layer = 0;
  int32_t expert = 0;
  int src = 0, dst = 0;
};

struct ExpertKey {
  int64_t moe_layer = 0;
  int32_t expert = 0;
};

struct MigrationPlan {
  std::vector<ExpertTransfer> transfers;      // by (moe layer, expert, dst)
  std::vector<std::vector<ExpertKey>> drops;  // [rank] experts it no longer holds
};

// Requires current and next for the same group size and expert count; `moe_layers` is the
// number of MoE layers (placements that are not per layer hold for all of them).
MigrationPlan plan_migration(const ExpertPlacement& current, const ExpertPlacement& next,
                             int64_t moe_layers);

// What one migration did, as seen from one rank.
struct MigrationReport {
  int64_t transfers = 0;                              // in the group
  int64_t group_bytes = 0;                            // bytes moved in the group
  int64_t bytes_sent = 0;                             // by this rank
  int64_t bytes_received = 0;                         // by this rank
  int64_t experts_received = 0, experts_dropped = 0;  // by this rank
  int64_t steps = 0;                                  // steps that carried chunks
  double seconds = 0;           // this rank's time in start() + advance() + finish()
  double max_step_seconds = 0;  // the longest advance() of this rank
  bool ok = false;              // the group switched to the new placement
  int64_t planned_at_step = 0, switched_at_step = 0;  // balancer steps (set by ExpertBalancer)
};

class ExpertMigration {
 public:
  enum class Progress { kInFlight, kDone, kFailed };

  // Collective. bytes_per_step >= 1. Error when the communicator fails or a peer's sizes make
  // no sense. When some sender cannot export an expert, every rank alike gets a migration with
  // export_failed() set (and export_error() saying why): nothing moves, the placement stays.
  static Result<std::unique_ptr<ExpertMigration>> start(Communicator& comm, ExpertHost& host,
                                                        MigrationPlan plan, int64_t bytes_per_step);

  // Steps that carry chunks (0: nothing to move; the caller may switch at once).
  int64_t steps() const { return steps_; }
  bool export_failed() const { return export_failed_; }
  const Status& export_error() const { return export_error_; }
  Result<Progress> advance();
  void finish();
  void cancel();
  const MigrationReport& report() const { return report_; }

 private:
  ExpertMigration(Communicator& comm, ExpertHost& host, MigrationPlan plan, int64_t bytes_per_step)
      : comm_(comm), host_(host), plan_(std::move(plan)), bytes_per_step_(bytes_per_step) {}

  Communicator& comm_;
  ExpertHost& host_;
  MigrationPlan plan_;
  int64_t bytes_per_step_;
  std::vector<int64_t> size_;     // [transfer] bytes
  std::vector<int64_t> offset_;   // [transfer] position in its sender's stream
  std::vector<ExpertBlob> blob_;  // [transfer] this rank's outgoing experts (others empty)
  std::vector<std::vector<uint8_t>> incoming_;  // [transfer] bytes arriving at this rank
  std::vector<int64_t> arrived_;                // [transfer] bytes of it arrived
  std::vector<size_t> installed_;               // transfers this rank installed
  int64_t steps_ = 0, step_ = 0;
  bool install_failed_ = false;
  bool export_failed_ = false;
  Status export_error_;
  Status install_error_;
  MigrationReport report_;
};

}  // namespace moeserve
