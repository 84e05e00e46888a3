// Dispatcher: how an MoE layer gets its tokens to the experts and the results back (DeepEP's
// dispatch/combine). The MoE layer calls it the same way whether experts are all local (one
// process, LocalDispatcher) or spread over the ranks of an EP group (EpDispatcher over a
// Communicator, ep_dispatcher.h).
//
// Protocol, once per MoE layer on every rank of the group (a rank with no tokens still calls,
// with n_tokens = 0, because dispatch and combine are collective):
//   1. dispatch(moe_layer, x, topk) -> ExpertBatch: the rows this rank's experts must process,
//      grouped by local expert in segments (grouped-contiguous layout, or masked in low-latency
//      mode). moe_layer counts MoE layers only (0 = the first); the placement of experts, and so
//      the rows a rank receives, may differ per layer (EPLB, expert_placement.h).
//   2. the caller runs each local expert on the rows in use of its segment
//      [segment_begin(s), + segment_rows(s)), writing out rows [n_rows(), hidden]; rows of
//      padding may be computed or not, they are ignored.
//   3. combine(batch, out) -> y[n_tokens, hidden] on the source rank: the gate-weighted sum of
//      each token's top-k expert outputs. The outputs may be F32 or already BF16 (what the fast
//      path's expert GEMMs write, and what DeepEP's combine carries): BF16 rows give the same y,
//      bit for bit, as their F32 values would, without an F32 pass over them.
// A Dispatcher is used by one thread at a time (the rank's step thread).
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/trace.h"
#include "ep/comm_worker.h"
#include "ep/row_pool.h"

namespace moeserve {

// How the rows of an ExpertBatch are laid out (DeepGEMM's two grouped GEMM layouts).
enum class ExpertLayout {
  kContiguous,  // segment s is rows [offsets[s], offsets[s+1]), all in use (normal mode)
  kMasked,      // segment s is a slab of `capacity` rows from offsets[s] = s * capacity; the first
                // counts[s] are in use, the rest are padding (zero rows in x; low-latency mode)
};

struct EpRoute;  // EpDispatcher's routing state (ep_dispatcher.h)

struct ExpertBatch {
  int64_t hidden = 0;
  int64_t n_tokens = 0;  // tokens this rank dispatched (rows of combine's y)
  ExpertLayout layout = ExpertLayout::kContiguous;
  // The row arrays are RowVectors (row_pool.h): storage recycled by the dispatcher that made
  // the batch once the batch is destroyed, so a dispatch does not page-fault fresh memory.
  RowVector<float> x;  // [n_rows(), hidden] received rows (dequantized), by expert
  // Instead of x, when the dispatcher delivers BF16 rows (EpOptions::bf16_rows; x is then
  // empty): each received token once, rounded to BF16 (what the fast path's expert GEMMs read
  // anyway), and for each row the token it reads, so row r holds the values x would hold,
  // rounded: bf16_row(r). A token is not copied once per expert (DeepEP's normal-mode receive
  // buffer); the grouped GEMM gathers the rows (gemm_fp8_grouped_contiguous_gather).
  RowVector<uint16_t> tokens_bf16;  // [tokens received, hidden]
  std::vector<int32_t> row_source;  // [n_rows()] token row of each row (padding rows: 0)
  std::vector<int32_t> experts;     // global ids of this rank's experts with a segment
  std::vector<int64_t> offsets;     // [experts.size() + 1] first row of each segment, end
  std::vector<int64_t> counts;      // [experts.size()] rows in use in each segment
  std::vector<float> row_weight;    // [n_rows()] gate weight of each row (padding: 0)
  // Private to the dispatcher that made the batch (how to route results back). The batch carries
  // all of it, so two batches (micro-batches) may be in flight between dispatch and combine.
  std::vector<int64_t> row_token;        // LocalDispatcher: [n_rows] source token index
  std::shared_ptr<const EpRoute> route;  // EpDispatcher

  int64_t n_rows() const { return offsets.empty() ? 0 : offsets.back(); }
  bool has_bf16_rows() const { return x.empty() && !row_source.empty(); }
  const uint16_t* bf16_row(int64_t r) const {  // [hidden], when has_bf16_rows()
    return tokens_bf16.data() + size_t(row_source[size_t(r)]) * size_t(hidden);
  }
  int64_t segment_begin(size_t s) const { return offsets[s]; }
  int64_t segment_rows(size_t s) const { return counts[s]; }
};

// How an asynchronous exchange appears on the trace's communication lane (nothing without a
// tracer).
struct CommLabel {
  Tracer* tracer = nullptr;
  std::string name;
};

class Dispatcher {
 public:
  virtual ~Dispatcher();

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Whether this rank holds routed expert e in some MoE layer.
  virtual bool holds_expert(int32_t expert) const = 0;
  // Whether this rank holds expert e in MoE layer moe_layer (its weights must then be loaded).
  virtual bool holds_layer_expert(int64_t moe_layer, int32_t expert) const = 0;

  // x: [n_tokens, hidden]; topk_ids, topk_weights: [n_tokens, top_k].
  virtual Result<ExpertBatch> dispatch(int64_t moe_layer, const float* x, int64_t n_tokens,
                                       int64_t hidden, const int32_t* topk_ids,
                                       const float* topk_weights, int64_t top_k) = 0;
  // dispatch(0, ...): for callers (benches, unit tests) whose placement is the same in every
  // layer.
  Result<ExpertBatch> dispatch(const float* x, int64_t n_tokens, int64_t hidden,
                               const int32_t* topk_ids, const float* topk_weights, int64_t top_k) {
    return dispatch(0, x, n_tokens, hidden, topk_ids, topk_weights, top_k);
  }
  // expert_out: [batch.n_rows(), hidden], F32 or BF16 bits; y: [n_tokens, hidden] (overwritten).
  virtual Status combine(const ExpertBatch& batch, const float* expert_out, float* y) = 0;
  virtual Status combine(const ExpertBatch& batch, const uint16_t* expert_out, float* y) = 0;

  // Dual micro-batch overlap (docs/ep-overlap.md): dispatch and combine on the dispatcher's
  // own communication thread (started on first use), one after another in submission order,
  // while the caller computes. Every rank of a group submits the same exchanges in the same
  // order, so the ranks' threads meet in the same collectives. What an exchange reads and
  // writes must stay alive and untouched until its future is ready, and every future must be
  // ready before the caller's next synchronous call or the dispatcher's destruction.
  std::future<Result<ExpertBatch>> dispatch_async(int64_t moe_layer, const float* x,
                                                  int64_t n_tokens, int64_t hidden,
                                                  const int32_t* topk_ids,
                                                  const float* topk_weights, int64_t top_k,
                                                  CommLabel label);
  // Exactly one of expert_f32, expert_bf16 is non-null (the combine overloads above).
  std::future<Status> combine_async(const ExpertBatch& batch, const float* expert_f32,
                                    const uint16_t* expert_bf16, float* y, CommLabel label);

 private:
  CommWorker& comm_thread();
  std::unique_ptr<CommWorker> comm_;  // the step thread's only: made by the first async call
};

// All experts in this process: dispatch is a gather, combine a weighted scatter-add. With
// bf16_rows (the fast path, like EpOptions::bf16_rows) dispatch rounds each token to BF16 once
// and delivers token rows (ExpertBatch::tokens_bf16) instead of a copy per expert.
class LocalDispatcher final : public Dispatcher {
 public:
  explicit LocalDispatcher(int64_t n_experts, bool bf16_rows = false)
      : n_experts_(n_experts), bf16_rows_(bf16_rows) {}

  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  bool holds_expert(int32_t e) const override { return e >= 0 && e < n_experts_; }
  bool holds_layer_expert(int64_t, int32_t e) const override { return holds_expert(e); }
  using Dispatcher::dispatch;
  Result<ExpertBatch> dispatch(int64_t moe_layer, const float* x, int64_t n_tokens, int64_t hidden,
                               const int32_t* topk_ids, const float* topk_weights,
                               int64_t top_k) override;
  Status combine(const ExpertBatch& batch, const float* expert_out, float* y) override;
  Status combine(const ExpertBatch& batch, const uint16_t* expert_out, float* y) override;

 private:
  int64_t n_experts_;
  bool bf16_rows_;
  std::shared_ptr<RowPool> rows_ = std::make_shared<RowPool>();  // storage of x, tokens_bf16
};

}  // namespace moeserve
