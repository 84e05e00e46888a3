// Dual micro-batch overlap (docs/ep-overlap.md): the layers of DeepseekModel::forward with the
// step's sequences split in two micro-batches that take turns on the step thread, while each
// one's dispatch and combine run on the dispatcher's communication thread (dispatch_async).
//
// The schedule is DeepSeek's prefill order, cut into two stages per MoE layer and micro-batch:
//   front    [shared experts, wait combine, residual of layer l-1] + layers up to the next MoE
//            layer l: attention, residual, ffn norm, gate; submit dispatch(l)
//   experts  wait dispatch(l), routed experts; submit combine(l)
// run as front(0) front(1) experts(0) experts(1) front(0) front(1) ..., so that every exchange
// of one micro-batch has compute of the other behind it, and every rank submits the same
// exchanges in the same order: per MoE layer dispatch mb0, dispatch mb1, combine mb0,
// combine mb1 (empty micro-batches included). The rows a sequence sends through each kernel are
// the same as without overlap, so the results are too.
#include <algorithm>
#include <future>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "core/check.h"
#include "model/deepseek.h"
#include "model/stage_span.h"

namespace moeserve {

namespace {

// Attention work of a sequence's new tokens: each attends to its whole context.
int64_t attention_work(const StepSequence& s) {
  const int64_t n = int64_t(s.tokens.size());
  return n * s.start_pos + n * (n + 1) / 2;
}

// An exchange's name on the trace's communication lane: "dispatch L3 mb0".
CommLabel comm_label_for(Tracer* tracer, const char* stage, int64_t layer, int mb) {
  if (!tracer) return {};
  return {tracer, fmt::format("{} L{} mb{}", stage, layer, mb)};
}

}  // namespace

std::array<std::vector<size_t>, 2> split_micro_batches(std::span<const StepSequence> batch,
                                                       int64_t min_tokens) {
  std::vector<size_t> order(batch.size());
  std::iota(order.begin(), order.end(), size_t(0));
  int64_t total = 0;
  for (const StepSequence& s : batch) total += int64_t(s.tokens.size());
  if (total < min_tokens) return {order, {}};
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return attention_work(batch[a]) > attention_work(batch[b]);
  });
  std::array<std::vector<size_t>, 2> mbs;
  std::array<int64_t, 2> work{0, 0}, tokens{0, 0};
  for (size_t i : order) {
    // The lighter one takes it; on a tie the one with fewer tokens (MoE work), then mb0.
    int to = work[1] < work[0] || (work[1] == work[0] && tokens[1] < tokens[0]) ? 1 : 0;
    mbs[size_t(to)].push_back(i);
    work[size_t(to)] += attention_work(batch[i]);
    tokens[size_t(to)] += int64_t(batch[i].tokens.size());
  }
  for (auto& m : mbs) std::sort(m.begin(), m.end());
  return mbs;
}

// One micro-batch's state across the stages of a layer. Buffers an in-flight exchange reads
// (h, ids, wts, batch, expert_out) or writes (out) are not touched until its future is ready.
struct DeepseekModel::MicroBatch {
  int index = 0;
  std::vector<StepSequence> seqs;
  int64_t n = 0;              // rows (new tokens)
  std::vector<float> x;       // [n, H] residual stream
  std::vector<float> h;       // [n, H] normalised input of the current sub-layer
  std::vector<float> out;     // [n, H] sub-layer output (attention, then combine's y)
  std::vector<float> shared;  // [n, H] shared experts' output
  std::vector<int32_t> ids;   // [n, top_k]
  std::vector<float> wts;     // [n, top_k]
  ExpertBatch batch;          // rows received for this rank's experts
  ExpertRows expert_out;      // [batch.n_rows(), H]
  int64_t layer = 0;          // next layer to run (front), or the MoE layer in flight
  bool moe_pending = false;   // layer `layer` is between dispatch and its residual add
  std::future<Result<ExpertBatch>> dispatched;
  std::future<Status> combined;

  // Waits for whatever is in flight (after an error: the exchanges reference our buffers).
  void drain() {
    if (dispatched.valid()) dispatched.wait();
    if (combined.valid()) combined.wait();
  }
  // The communication worker's jobs point into this micro-batch: however the step ends (an
  // exception unwinding included), none may still run once it is gone.
  ~MicroBatch() { drain(); }
};

int64_t DeepseekModel::overlap_min_tokens() const {
  if (overlap_min_tokens_ >= 0) return overlap_min_tokens_;
  const int64_t ranks = std::max(1, dispatcher_.world_size()),
                k = std::max<int64_t>(1, config_.num_experts_per_tok);
  return (2 * kOverlapRidgeRows * config_.n_routed_experts + ranks * k - 1) / (ranks * k);
}

Status DeepseekModel::layers_overlapped(std::span<const StepSequence> batch, KvCache& cache,
                                        std::vector<float>& x) {
  const int64_t H = config_.hidden_size;
  std::vector<int64_t> first_row(batch.size() + 1, 0);  // row of each sequence in x
  for (size_t i = 0; i < batch.size(); ++i) {
    first_row[i + 1] = first_row[i] + int64_t(batch[i].tokens.size());
  }
  const std::array<std::vector<size_t>, 2> split = split_micro_batches(batch, overlap_min_tokens());
  std::array<MicroBatch, 2> mbs;
  for (int m = 0; m < 2; ++m) {
    MicroBatch& mb = mbs[size_t(m)];
    mb.index = m;
    for (size_t i : split[size_t(m)]) {
      mb.seqs.push_back(batch[i]);
      mb.n += int64_t(batch[i].tokens.size());
    }
    mb.x.resize(size_t(mb.n * H));  // [n, H] this micro-batch's rows of x, in its order
    float* dst = mb.x.data();
    for (size_t i : split[size_t(m)]) {
      dst = std::copy(x.data() + first_row[i] * H, x.data() + first_row[i + 1] * H, dst);
    }
    mb.h.resize(size_t(mb.n * H));
    mb.out.resize(size_t(mb.n * H));
  }
  Status st = run_micro_batches(mbs, cache);
  for (MicroBatch& mb : mbs) mb.drain();
  RETURN_IF_ERROR(st);
  for (int m = 0; m < 2; ++m) {  // rows back to batch order
    const float* src = mbs[size_t(m)].x.data();
    for (size_t i : split[size_t(m)]) {
      const int64_t count = (first_row[i + 1] - first_row[i]) * H;
      std::copy(src, src + count, x.data() + first_row[i] * H);
      src += count;
    }
  }
  return Status::Ok();
}

Status DeepseekModel::run_micro_batches(std::array<MicroBatch, 2>& mbs, KvCache& cache) {
  for (MicroBatch& mb : mbs) advance_to_dispatch(mb, cache);
  while (mbs[0].moe_pending) {
    CHECK(mbs[1].moe_pending && mbs[1].layer == mbs[0].layer, "micro-batches out of step");
    for (MicroBatch& mb : mbs) RETURN_IF_ERROR(submit_combine(mb));
    for (MicroBatch& mb : mbs) {
      RETURN_IF_ERROR(finish_moe(mb));
      advance_to_dispatch(mb, cache);
    }
  }
  return Status::Ok();
}

// Runs layers from mb.layer until one submits its dispatch (moe_pending) or none is left.
void DeepseekModel::advance_to_dispatch(MicroBatch& mb, KvCache& cache) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, n = mb.n, k = c.num_experts_per_tok;
  for (; mb.layer < c.num_hidden_layers; ++mb.layer) {
    const int64_t l = mb.layer;
    attention_stage(l, mb.index, mb.seqs, cache, mb.x.data(), mb.h.data(), mb.out.data(), n);
    if (!weights_.layers[size_t(l)].moe) {
      mlp_stage(l, mb.index, mb.h.data(), mb.x.data(), mb.out.data(), n);
      continue;
    }
    mb.ids.resize(size_t(n * k));  // [n, k]
    mb.wts.resize(size_t(n * k));  // [n, k]
    gate_stage(l, mb.index, mb.h.data(), n, mb.ids.data(), mb.wts.data());
    const int64_t moe_layer = moe_layer_index(l);
    mb.dispatched =
        dispatcher_.dispatch_async(moe_layer, mb.h.data(), n, H, mb.ids.data(), mb.wts.data(), k,
                                   comm_label_for(tracer_, "dispatch", l, mb.index));
    mb.moe_pending = true;
    return;
  }
}

// Waits for the dispatch, runs the routed experts, submits the combine.
Status DeepseekModel::submit_combine(MicroBatch& mb) {
  Result<ExpertBatch> got = mb.dispatched.get();
  RETURN_IF_ERROR(got.status());
  mb.batch = std::move(*got);
  RETURN_IF_ERROR(experts_stage(mb.layer, mb.index, mb.batch, mb.expert_out));
  const bool bf16 = path_ == ComputePath::kFast;  // the rows combine() would hand on
  mb.combined = dispatcher_.combine_async(mb.batch, bf16 ? nullptr : mb.expert_out.f32.data(),
                                          bf16 ? mb.expert_out.bf16.data() : nullptr,
                                          mb.out.data(),  // [n, H]
                                          comm_label_for(tracer_, "combine", mb.layer, mb.index));
  return Status::Ok();
}

// Shared experts while the combine is in flight, then the MoE layer's residual add.
Status DeepseekModel::finish_moe(MicroBatch& mb) {
  mb.shared.resize(size_t(mb.n * config_.hidden_size));
  shared_stage(mb.layer, mb.index, mb.h.data(), mb.n, mb.shared.data());  // [n, H]
  RETURN_IF_ERROR(mb.combined.get());
  moe_residual(mb.layer, mb.x.data(), mb.out.data(), mb.shared.data(), mb.n);
  mb.moe_pending = false;
  ++mb.layer;
  return Status::Ok();
}

}  // namespace moeserve
