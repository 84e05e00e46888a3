// Dispatcher: how an MoE layer gets its tokens to the experts and the results back (DeepEP's
// dispatch/combine). The MoE layer calls it the same way whether experts are all local (one
// process, LocalDispatcher) or spread over the ranks of an EP group (the MPI dispatcher).
//
// Protocol, once per MoE layer on every rank of the group (a rank with no tokens still calls,
// with n_tokens = 0, because dispatch and combine are collective):
//   1. dispatch(x, topk) -> ExpertBatch: the rows this rank's experts must process, grouped by
//      local expert in contiguous segments (the grouped-contiguous GEMM layout).
//   2. the caller runs each local expert on its segment, writing out rows [n_rows, hidden].
//   3. combine(batch, out) -> y[n_tokens, hidden] on the source rank: the gate-weighted sum of
//      each token's top-k expert outputs.
// A Dispatcher is used by one thread at a time (the rank's step thread).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace moeserve {

struct ExpertBatch {
  int64_t hidden = 0;
  std::vector<float> x;                // [n_rows, hidden] received rows, grouped by expert
  std::vector<int32_t> experts;        // global ids of this rank's experts with a segment
  std::vector<int64_t> offsets;        // [experts.size() + 1] row offsets of each segment
  // Private to the dispatcher (how to route results back).
  std::vector<int64_t> row_token;      // [n_rows] source token index
  std::vector<float> row_weight;       // [n_rows] gate weight
  int64_t n_tokens = 0;

  int64_t n_rows() const { return offsets.empty() ? 0 : offsets.back(); }
};

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Whether this rank holds routed expert e (it must then be loaded here).
  virtual bool holds_expert(int32_t expert) const = 0;

  // x: [n_tokens, hidden]; topk_ids, topk_weights: [n_tokens, top_k].
  virtual Result<ExpertBatch> dispatch(const float* x, int64_t n_tokens, int64_t hidden,
                                       const int32_t* topk_ids, const float* topk_weights,
                                       int64_t top_k) = 0;
  // expert_out: [batch.n_rows(), hidden]; y: [n_tokens, hidden] (overwritten).
  virtual Status combine(const ExpertBatch& batch, const float* expert_out, float* y) = 0;
};

// All experts in this process: dispatch is a gather, combine a weighted scatter-add.
class LocalDispatcher final : public Dispatcher {
 public:
  explicit LocalDispatcher(int64_t n_experts) : n_experts_(n_experts) {}

  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  bool holds_expert(int32_t e) const override { return e >= 0 && e < n_experts_; }
  Result<ExpertBatch> dispatch(const float* x, int64_t n_tokens, int64_t hidden,
                               const int32_t* topk_ids, const float* topk_weights,
                               int64_t top_k) override;
  Status combine(const ExpertBatch& batch, const float* expert_out, float* y) override;

 private:
  int64_t n_experts_;
};

}  // namespace moeserve
