// EpDispatcher: dispatch and combine across the ranks of an EP group, with DeepEP's semantics,
// over a Communicator (docs/ep-wire-format.md).
//
//   layout    from the top-k ids: which rank computes each (token, expert) (ExpertPlacement of
//             the MoE layer: with redundant experts, one of the expert's replicas, a copy on this
//             rank first), how many records and (token, expert) entries per rank.
//   dispatch  each token once per destination rank (not once per expert): its payload (FP8 e4m3
//             with 1x128 scales, or BF16) plus its top-k ids and weights restricted to that rank.
//             The receiver dequantizes and groups rows by local (logical) expert.
//   combine   each expert output row goes back to its token's rank as BF16; the source sums a
//             token's rows with its gate weights in ascending expert id order (LocalDispatcher's
//             order), so y does not depend on R or on the placement (bit for bit, given the same
//             expert outputs), and with the F32 payload equals LocalDispatcher's bit for bit.
// Modes:
//   normal       the record counts go round first (a small all-to-all), then exact-size
//                exchanges; rows in the grouped-contiguous layout. For prefill and big batches.
//   low-latency  fixed-capacity buffers per peer allocated once at creation (max_tokens_per_rank
//                records for dispatch, max_tokens_per_rank * top_k rows for combine); no size
//                round trip (the receiver learns sizes from the messages); rows in the masked
//                layout. For decode. More tokens than the capacity is an error.
//
// Collective: every rank of the group calls dispatch and combine the same number of times in the
// same order, n_tokens = 0 included. Used by one thread at a time. An ExpertLoadCounter, when
// attached, sees every dispatch (counts per expert and per destination rank; load counting). The
// scratch buffers it owns are free again when a call returns; all routing state lives in the
// ExpertBatch, so two batches (micro-batches) may be between dispatch and combine at once.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ep/communicator.h"
#include "ep/dispatcher.h"
#include "ep/expert_load_counter.h"
#include "ep/expert_placement.h"
#include "ep/wire_format.h"

namespace moeserve {

enum class EpMode { kNormal, kLowLatency };

const char* ep_mode_name(EpMode m);  // "normal", "low-latency"
std::optional<EpMode> ep_mode_from_name(std::string_view name);

struct EpOptions {
  DispatchDType dtype = DispatchDType::kFp8;
  EpMode mode = EpMode::kNormal;
  // Low-latency mode sizes its buffers from these (normal mode ignores them).
  int64_t hidden = 0;
  int64_t top_k = 0;
  int64_t max_tokens_per_rank = 0;  // most tokens any rank passes to one dispatch
  // Deliver received rows as BF16 (ExpertBatch::tokens_bf16) rather than F32, for experts that
  // round their inputs to BF16 anyway (the fast path): half the bytes written and read, no F32
  // pass. Ignored with the F32 payload (which exists to be lossless).
  bool bf16_rows = false;
};

// Routing state of one dispatched batch (held by ExpertBatch::route).
struct EpRoute {
  // Source side: this rank's tokens.
  int64_t top_k = 0;
  std::vector<float> weights;     // [n_tokens, top_k] gate weights
  std::vector<int64_t> slot_row;  // [n_tokens, top_k] row of the slot in the combine receive buffer
  std::vector<int32_t> sum_order;  // [n_tokens, top_k] slots of each token by ascending expert id
  std::vector<size_t> recv_rows;   // [R] combine rows coming back from each rank
  std::vector<size_t> recv_row_base;  // [R] first row of each rank's chunk there
  // Expert side: rows received from other ranks.
  std::vector<int64_t> return_row;    // batch row of each combine send row, in send order
  std::vector<size_t> send_rows;      // [R] combine rows going back to each rank
  std::vector<size_t> send_row_base;  // [R] first row of each rank's chunk in the send buffer
};

class EpDispatcher final : public Dispatcher {
 public:
  // placement.n_ranks() must equal comm.size(). Borrows comm: it must outlive the dispatcher.
  static Result<std::unique_ptr<EpDispatcher>> create(Communicator& comm, ExpertPlacement placement,
                                                      EpOptions options);

  int rank() const override { return comm_.rank(); }
  int world_size() const override { return comm_.size(); }
  bool holds_expert(int32_t e) const override {
    return e >= 0 && e < placement_.n_experts() && placement_.holds_in_any_layer(comm_.rank(), e);
  }
  bool holds_layer_expert(int64_t moe_layer, int32_t e) const override {
    return e >= 0 && e < placement_.n_experts() && placement_.valid_layer(moe_layer) &&
           placement_.holds(moe_layer, comm_.rank(), e);
  }
  const ExpertPlacement& placement() const { return placement_; }
  const EpOptions& options() const { return options_; }
  // Replaces the placement between two steps (no batch between dispatch and combine); every rank
  // must switch before the same dispatch, and this rank must be able to compute the experts the
  // new placement gives it. InvalidArgument if it is for another group size or expert count.
  Status set_placement(ExpertPlacement placement);
  // Counts every later dispatch into `counter` (borrowed; nullptr stops counting).
  void set_load_counter(ExpertLoadCounter* counter) { counter_ = counter; }

  using Dispatcher::dispatch;
  Result<ExpertBatch> dispatch(int64_t moe_layer, const float* x, int64_t n_tokens, int64_t hidden,
                               const int32_t* topk_ids, const float* topk_weights,
                               int64_t top_k) override;
  Status combine(const ExpertBatch& batch, const float* expert_out, float* y) override;
  Status combine(const ExpertBatch& batch, const uint16_t* expert_out, float* y) override;

 private:
  template <typename Row>  // float or uint16_t (BF16 bits)
  Status combine_rows(const ExpertBatch& batch, const Row* expert_out, float* y);
  EpDispatcher(Communicator& comm, ExpertPlacement placement, EpOptions options);

  // Turns the received records (from rank p: records[p] of them at recv + base[p]) into rows.
  Result<ExpertBatch> unpack(int64_t moe_layer, const DispatchRecordLayout& L, const uint8_t* recv,
                             const std::vector<size_t>& base, const std::vector<size_t>& records,
                             int64_t n_tokens, EpRoute route);

  Communicator& comm_;
  ExpertPlacement placement_;
  EpOptions options_;
  ExpertLoadCounter* counter_ = nullptr;
  std::vector<int32_t> dest_;  // [n_tokens, top_k] rank computing each (token, expert)
  // [moe layers][n_experts] tokens this rank sent to each expert so far (replica choice).
  std::vector<std::vector<uint64_t>> seq_;
  // Scratch, reused across calls (fixed size in low-latency mode).
  std::vector<uint8_t> dispatch_send_, dispatch_recv_;
  std::vector<uint16_t> combine_send_, combine_recv_;  // rows of combine_row_bytes
  std::vector<uint16_t> x_bf16_;                       // [n_tokens, hidden] BF16 payload
  std::vector<uint8_t> x_fp8_;                         // [n_tokens, hidden]
  std::vector<float> x_scales_;                        // [n_tokens, n_scales]
  std::vector<float> scales_tmp_;                      // [n_scales] of one received record
  std::vector<uint16_t> row_tmp_;                      // [hidden] one BF16 row
  std::vector<float> row_f32_;                         // [hidden] one F32 row
  std::vector<float> combine_row_f32_;                 // [hidden] one combine row as F32
  // Storage of the batches' rows (x, tokens_bf16), shared with every batch this dispatcher made.
  std::shared_ptr<RowPool> rows_ = std::make_shared<RowPool>();
};

}  // namespace moeserve
