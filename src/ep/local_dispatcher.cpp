#include <cstdint>
#include <cstring>

#include "ep/dispatcher.h"
#include "kernels/convert.h"

namespace moeserve {

Result<ExpertBatch> LocalDispatcher::dispatch(int64_t /*moe_layer*/, const float* x,
                                              int64_t n_tokens, int64_t hidden,
                                              const int32_t* topk_ids, const float* topk_weights,
                                              int64_t top_k) {
  if (n_tokens > INT32_MAX) {  // token rows are indexed by int32 (ExpertBatch::row_source)
    return InvalidArgument("dispatch: more than 2^31 tokens in one step");
  }
  // Count rows per expert, then place each (token, slot) in its expert's segment, keeping
  // token order inside a segment.
  std::vector<int64_t> count(size_t(n_experts_), 0);
  for (int64_t i = 0; i < n_tokens * top_k; ++i) {
    int32_t e = topk_ids[i];
    if (e < 0 || e >= n_experts_) return Internal("dispatch: expert id out of range");
    ++count[size_t(e)];
  }
  ExpertBatch b;
  b.hidden = hidden;
  b.n_tokens = n_tokens;
  b.offsets.push_back(0);
  std::vector<int64_t> start(size_t(n_experts_), 0);
  for (int64_t e = 0; e < n_experts_; ++e) {
    if (count[size_t(e)] == 0) continue;
    start[size_t(e)] = b.offsets.back();
    b.experts.push_back(int32_t(e));
    b.offsets.push_back(b.offsets.back() + count[size_t(e)]);
    b.counts.push_back(count[size_t(e)]);
  }
  const int64_t n_rows = b.offsets.back();
  if (bf16_rows_ && n_rows > 0) {
    b.tokens_bf16 = RowVector<uint16_t>(RowAllocator<uint16_t>(rows_));
    b.tokens_bf16.resize(size_t(n_tokens * hidden));  // [n_tokens, hidden]
    f32_to_bf16_row_isa(x, n_tokens * hidden, b.tokens_bf16.data());
    b.row_source.resize(size_t(n_rows));
  } else {
    b.x = RowVector<float>(RowAllocator<float>(rows_));
    b.x.resize(size_t(n_rows * hidden));  // [n_rows, hidden], every row written below
  }
  b.row_token.resize(size_t(n_rows));
  b.row_weight.resize(size_t(n_rows));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      int32_t e = topk_ids[t * top_k + j];
      int64_t row = start[size_t(e)]++;
      if (bf16_rows_) {
        b.row_source[size_t(row)] = int32_t(t);
      } else {
        std::memcpy(&b.x[size_t(row * hidden)], x + t * hidden, size_t(hidden) * sizeof(float));
      }
      b.row_token[size_t(row)] = t;
      b.row_weight[size_t(row)] = topk_weights[t * top_k + j];
    }
  }
  return b;
}

Status LocalDispatcher::combine(const ExpertBatch& b, const float* expert_out, float* y) {
  std::memset(y, 0, size_t(b.n_tokens * b.hidden) * sizeof(float));  // [n_tokens, hidden]
  for (int64_t row = 0; row < b.n_rows(); ++row) {
    float* yt = y + b.row_token[size_t(row)] * b.hidden;
    const float* o = expert_out + row * b.hidden;
    float w = b.row_weight[size_t(row)];
    for (int64_t i = 0; i < b.hidden; ++i) yt[i] += w * o[i];
  }
  return Status::Ok();
}

Status LocalDispatcher::combine(const ExpertBatch& b, const uint16_t* expert_out, float* y) {
  // The F32 combine's arithmetic on the widened values (product rounded, then the add).
  std::memset(y, 0, size_t(b.n_tokens * b.hidden) * sizeof(float));  // [n_tokens, hidden]
  for (int64_t row = 0; row < b.n_rows(); ++row) {
    bf16_axpy_row(b.row_weight[size_t(row)], expert_out + row * b.hidden, b.hidden,
                  y + b.row_token[size_t(row)] * b.hidden);
  }
  return Status::Ok();
}

}  // namespace moeserve
