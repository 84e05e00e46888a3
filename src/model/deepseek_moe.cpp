// DeepSeek-V2/V3's MoE layer (docs/ep-serving.md): the router's top-k (moe_gate: noaux_tc with
// sigmoid scores and group limits for V3, softmax greedy or group-limited greedy for V2), the
// routed experts on the rows the dispatcher brings to this rank, the shared experts, and the
// dense MLP of the first layers. Shapes: n = rows, H = hidden_size, I = intermediate size.
#include <algorithm>
#include <cstring>
#include <functional>

#include <fmt/format.h>

#include "core/check.h"
#include "kernels/convert.h"
#include "kernels/gemm_bf16.h"
#include "kernels/linear_ref.h"
#include "kernels/moe_gate.h"
#include "kernels/silu_mul.h"
#include "model/deepseek.h"
#include "model/stage_span.h"

namespace moeserve {

namespace {

MoeGateParams gate_params(const ModelConfig& c) {
  MoeGateParams p;
  p.scoring = c.scoring_func == ScoringFunc::kSigmoid ? MoeGateParams::Scoring::kSigmoid
                                                      : MoeGateParams::Scoring::kSoftmax;
  p.method = c.topk_method == TopkMethod::kNoauxTc ? MoeGateParams::Method::kNoauxTc
             : c.topk_method == TopkMethod::kGroupLimitedGreedy
                 ? MoeGateParams::Method::kGroupLimitedGreedy
                 : MoeGateParams::Method::kGreedy;
  p.weight_rule = c.model_type == "deepseek_v2" ? MoeGateParams::WeightRule::kV2NormElseScale
                                                : MoeGateParams::WeightRule::kV3NormThenScale;
  p.n_experts = c.n_routed_experts;
  p.top_k = c.num_experts_per_tok;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.norm_topk_prob = c.norm_topk_prob;
  p.routed_scaling_factor = float(c.routed_scaling_factor);
  return p;
}

// Elementwise work over [0, n), split over the pool when it is big enough to pay for the
// hand-off (results do not depend on the split).
void elementwise(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool && n >= (int64_t(1) << 15)) {
    pool->parallel_for(n, fn, 4096);
  } else {
    fn(0, n);
  }
}

}  // namespace

int64_t DeepseekModel::moe_layer_index(int64_t layer) const {
  // The dispatcher places experts per MoE layer (EPLB), so it needs this layer's index among
  // the MoE layers.
  int64_t moe_layer = 0;
  for (int64_t l = 0; l < layer; ++l) moe_layer += config_.is_moe_layer(l);
  return moe_layer;
}

void DeepseekModel::gate_stage(int64_t layer, int mb, const float* x, int64_t n, int32_t* ids,
                               float* wts) {
  StageSpan span(tracer_, "gate", layer, mb);
  const MoeWeights& w = *weights_.layers[size_t(layer)].moe;
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, E = c.n_routed_experts;
  std::vector<float> router(size_t(n * E));  // [n, E] router logits
  // The router in FP32 on both paths: routing is discrete, and a BF16 rounding of the input can
  // flip a near-tied expert choice (Hugging Face computes it in FP32 too).
  if (auto it = gate_f32_.find(w.gate.data); it != gate_f32_.end()) {
    gemm_f32(x, n, H, it->second.data(), E, H, H, router.data(), E, pool_);
  } else if (path_ == ComputePath::kFast && w.gate.dtype == DType::kBF16) {
    gemm_f32_bf16w(x, n, H, reinterpret_cast<const uint16_t*>(w.gate.data), E, H, H, router.data(),
                   E, pool_);
  } else {
    linear_ref(x, n, H, w.gate, router.data(), E, pool_);
  }
  moe_gate_ref(router.data(), n, w.score_bias.empty() ? nullptr : w.score_bias.data(),
               gate_params(c), ids, wts);  // [n, k] each
  if (route_observer_) route_observer_(layer, {ids, size_t(n * c.num_experts_per_tok)});
}

Status DeepseekModel::experts_stage(int64_t layer, int mb, const ExpertBatch& b, ExpertRows& out) {
  StageSpan span(tracer_, "experts", layer, mb);
  const MoeWeights& w = *weights_.layers[size_t(layer)].moe;
  const int64_t H = config_.hidden_size, n_rows = b.n_rows();
  for (int32_t e : b.experts) {
    if (!held_expert(w, e))
      return Internal(fmt::format("expert {} was dispatched here but is not loaded", e));
  }
  const bool fast = path_ == ComputePath::kFast;
  // The fast path hands every expert output on as BF16, as a BF16 model does and as the EP
  // combine sends it (DeepEP combines in BF16): one process and any number of ranks then sum
  // the same values in the same order, so BF16 dispatch changes no bit of the result.
  // (Resized, not reassigned: every row in use is written below, and the vectors are reused.)
  if (fast) {
    out.f32.clear();
  } else {
    out.bf16.clear();
  }
  // (A rank may receive no rows; then expert 0 need not be loaded here.)
  if (fast && b.layout == ExpertLayout::kContiguous && !b.experts.empty() &&
      held_expert(w, b.experts[0])->gate.dtype == DType::kF8E4M3) {
    out.bf16.resize(size_t(n_rows * H));
    experts_grouped(w, b, out.bf16.data());
    return Status::Ok();
  }
  // Expert by expert in F32 (the masked layout's padding rows zero), rounded to BF16 on the
  // fast path.
  std::vector<float>& f32 = fast ? scratch_.rows_f32 : out.f32;  // [n_rows, H]
  if (b.layout == ExpertLayout::kMasked) {
    f32.assign(size_t(n_rows * H), 0.0f);
  } else {
    f32.resize(size_t(n_rows * H));
  }
  std::vector<float> seg_x;  // a segment's rows as F32 when the batch carries BF16 rows
  for (size_t s = 0; s < b.experts.size(); ++s) {
    int64_t r0 = b.segment_begin(s), rows = b.segment_rows(s);
    const float* x = b.x.data() + r0 * H;
    if (b.has_bf16_rows()) {
      seg_x.resize(size_t(rows * H));
      for (int64_t r = 0; r < rows; ++r) {
        bf16_to_f32_row(b.bf16_row(r0 + r), H, &seg_x[size_t(r * H)]);
      }
      x = seg_x.data();
    }
    mlp(*held_expert(w, b.experts[s]), x, rows, &f32[size_t(r0 * H)]);
  }
  if (fast) {
    out.bf16.resize(size_t(n_rows * H));
    elementwise(pool_, n_rows * H, [&](int64_t i0, int64_t i1) {
      f32_to_bf16_row(&f32[size_t(i0)], i1 - i0, &out.bf16[size_t(i0)]);
    });
  }
  return Status::Ok();
}

Status DeepseekModel::combine(const ExpertBatch& b, const ExpertRows& rows, float* y) {
  if (path_ == ComputePath::kFast) return dispatcher_.combine(b, rows.bf16.data(), y);
  return dispatcher_.combine(b, rows.f32.data(), y);
}

// All of a step's routed experts in three grouped GEMMs (DeepGEMM's contiguous layout: rows
// sorted by expert) instead of three dense GEMMs per expert: one pass over the thread pool per
// projection, however many experts the batch touches.
void DeepseekModel::experts_grouped(const MoeWeights& w, const ExpertBatch& b, uint16_t* out) {
  const int64_t H = b.hidden, rows = b.n_rows(), n_seg = int64_t(b.experts.size());
  if (rows == 0) return;
  const int64_t I = held_expert(w, b.experts[0])->gate.rows;
  const size_t segs = static_cast<size_t>(n_seg);
  std::vector<const PackedLinear*> gate(segs), up(segs), down(segs);
  for (int64_t s = 0; s < n_seg; ++s) {
    const MlpWeights& ex = *held_expert(w, b.experts[size_t(s)]);
    gate[size_t(s)] = &packed_.at(ex.gate.data);
    up[size_t(s)] = &packed_.at(ex.up.data);
    down[size_t(s)] = &packed_.at(ex.down.data);
  }
  // Scratch kept across calls (the step thread is the only caller): megabytes per layer that a
  // fresh allocation would page-fault in again every time.
  std::vector<uint16_t>& xb = scratch_.xb;    // [rows, H] BF16 input, unless delivered as BF16
  std::vector<uint16_t>& act = scratch_.act;  // [rows, I] BF16 SiLU(g) * u
  std::vector<float>& g = scratch_.g;
  std::vector<float>& u = scratch_.u;  // [rows, I]
  g.resize(size_t(rows * I));
  u.resize(size_t(rows * I));
  act.resize(size_t(rows * I));
  const int64_t* off = b.offsets.data();
  const GemmOutput g_out{g.data(), DType::kF32, I}, u_out{u.data(), DType::kF32, I};
  if (b.has_bf16_rows()) {
    // Each token's BF16 row once; the GEMMs gather a segment's rows by index.
    const uint16_t* tok = b.tokens_bf16.data();
    const int32_t* src = b.row_source.data();
    gemm_linear_grouped(tok, H, src, off, gate, g_out, pool_);
    gemm_linear_grouped(tok, H, src, off, up, u_out, pool_);
  } else {
    xb.resize(size_t(rows * H));
    f32_to_bf16_row(b.x.data(), rows * H, xb.data());
    gemm_linear_grouped(xb.data(), H, nullptr, off, gate, g_out, pool_);
    gemm_linear_grouped(xb.data(), H, nullptr, off, up, u_out, pool_);
  }
  elementwise(pool_, rows * I, [&](int64_t i0, int64_t i1) {
    silu_mul_bf16(&g[size_t(i0)], &u[size_t(i0)], i1 - i0, &act[size_t(i0)]);  // [rows, I]
  });
  gemm_linear_grouped(act.data(), I, nullptr, off, down, {out, DType::kBF16, H}, pool_);
}

void DeepseekModel::mlp(const MlpWeights& w, const float* x, int64_t n, float* out) {
  const int64_t H = w.gate.cols, I = w.gate.rows;
  std::vector<float>& g = scratch_.mlp_g;
  std::vector<float>& u = scratch_.mlp_u;  // [n, I], reused (see ExpertScratch)
  g.resize(size_t(n * I));
  u.resize(size_t(n * I));
  linear(x, n, H, w.gate, g.data(), I);
  linear(x, n, H, w.up, u.data(), I);
  elementwise(pool_, n * I, [&](int64_t i0, int64_t i1) {
    const int64_t len = i1 - i0;  // [n, I] SiLU(g) * u, into g
    if (path_ == ComputePath::kFast) {
      silu_mul(&g[size_t(i0)], &u[size_t(i0)], len, &g[size_t(i0)]);
    } else {
      silu_mul_ref(&g[size_t(i0)], &u[size_t(i0)], len, &g[size_t(i0)]);
    }
  });
  linear(g.data(), n, I, w.down, out, H);  // [n, H]
}

}  // namespace moeserve
