#include "ep/dispatcher.h"

namespace moeserve {

namespace {

// Runs fn, recording it on the communication lane when the label has a tracer.
template <class F>
auto traced(const CommLabel& label, F&& fn) {
  const double t0 = label.tracer ? label.tracer->now_us() : 0;
  auto result = fn();
  if (label.tracer) label.tracer->add(label.name, TraceLane::kComm, t0, label.tracer->now_us());
  return result;
}

}  // namespace

Dispatcher::~Dispatcher() = default;

CommWorker& Dispatcher::comm_thread() {
  if (!comm_) comm_ = std::make_unique<CommWorker>();
  return *comm_;
}

std::future<Result<ExpertBatch>> Dispatcher::dispatch_async(int64_t moe_layer, const float* x,
                                                            int64_t n_tokens, int64_t hidden,
                                                            const int32_t* topk_ids,
                                                            const float* topk_weights,
                                                            int64_t top_k, CommLabel label) {
  return comm_thread().submit([=, this, label = std::move(label)] {
    return traced(label, [&] {
      return dispatch(moe_layer, x, n_tokens, hidden, topk_ids, topk_weights, top_k);
    });
  });
}

std::future<Status> Dispatcher::combine_async(const ExpertBatch& batch, const float* expert_f32,
                                              const uint16_t* expert_bf16, float* y,
                                              CommLabel label) {
  return comm_thread().submit([=, this, &batch, label = std::move(label)] {
    return traced(label, [&] {
      return expert_bf16 ? combine(batch, expert_bf16, y) : combine(batch, expert_f32, y);
    });
  });
}

}  // namespace moeserve
