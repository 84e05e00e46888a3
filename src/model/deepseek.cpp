// The forward pass, top to bottom: embed -> layers (attention, dense MLP or MoE) -> norm ->
// lm_head. Shapes in the comments use n = new tokens in the step, H = hidden_size,
// nh = heads, dn/dr/dv = qk_nope/qk_rope/v head dims, R = kv_lora_rank, T = context length.
#include "model/deepseek.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>

#include <fmt/format.h>

#include "core/check.h"
#include "kernels/convert.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_fp8_f32x.h"
#include "kernels/linear_ref.h"
#include "kernels/mla_decode.h"
#include "kernels/moe_gate.h"
#include "kernels/rmsnorm.h"
#include "kernels/silu_mul.h"
#include "model/stage_span.h"

namespace moeserve {

namespace {

// q_a_layernorm and kv_a_layernorm are built without the config's eps in DeepSeek's model.py,
// its hub code and transformers: always 1e-6 (docs/hf-reference.md section 2).
constexpr float kLoraNormEps = 1e-6f;

RopeParams rope_params(const ModelConfig& c) {
  RopeParams p;
  p.dim = c.qk_rope_head_dim;
  p.theta = c.rope_theta;
  if (c.rope_scaling) {
    const YarnScaling& y = *c.rope_scaling;
    p.yarn = true;
    p.factor = y.factor;
    p.original_max_position_embeddings = y.original_max_position_embeddings;
    p.beta_fast = y.beta_fast;
    p.beta_slow = y.beta_slow;
    p.mscale = y.mscale;
    p.mscale_all_dim = y.mscale_all_dim;
  }
  return p;
}

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

void add_into(float* x, const float* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] += y[i];
}

// In-place softmax over v[0, n).
void softmax(float* v, int64_t n) {
  float mx = *std::max_element(v, v + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    v[i] = std::exp(v[i] - mx);
    sum += v[i];
  }
  float inv = float(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) v[i] *= inv;
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

DeepseekModel::DeepseekModel(const ModelConfig& config, const ModelWeights& weights,
                             Dispatcher& dispatcher, ThreadPool* pool, AttentionMode mode,
                             ComputePath path, bool overlap, bool progress, GemmInt8Options int8,
                             const WeightCacheOptions& weight_cache)
    : config_(config),
      weights_(weights),
      dispatcher_(dispatcher),
      pool_(pool),
      mode_(mode),
      path_(path),
      overlap_(overlap),
      rope_(rope_params(config)),
      int8_(int8),
      experts_(config, weights, path == ComputePath::kFast ? &packed_ : nullptr,
               int8.expert_format()) {
  if (path_ == ComputePath::kFast) prepare_fast_path(progress, weight_cache);
}

Status DeepseekModel::supports(const ModelConfig& c, ComputePath path) {
  if (path == ComputePath::kFast && c.quant &&
      (c.quant->block_n != 128 || c.quant->block_k != 128)) {
    return InvalidArgument(fmt::format(
        "config.json: quantization_config.weight_block_size [{}, {}] is not supported by the fast "
        "path's FP8 GEMMs, which need [128, 128] (DeepSeek's release); --compute reference runs it",
        c.quant->block_n, c.quant->block_k));
  }
  return Status::Ok();
}

void DeepseekModel::linear(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y,
                           int64_t ldy) {
  if (m == 0) return;  // (linear_ref would still dequantize every row of w)
  if (path_ == ComputePath::kReference || (w.dtype != DType::kF8E4M3 && w.dtype != DType::kBF16)) {
    linear_ref(x, m, ldx, w, y, ldy, pool_);
    return;
  }
  const int64_t k = w.cols;
  x_bf16_.resize(size_t(m * k));  // [m, k] BF16
  for (int64_t i = 0; i < m; ++i) f32_to_bf16_row(x + i * ldx, k, &x_bf16_[size_t(i * k)]);
  if (w.dtype == DType::kF8E4M3) {
    gemm_linear(x_bf16_.data(), m, k, packed_.at(w.data), {y, DType::kF32, ldy}, pool_);
  } else if (&w == &weights_.lm_head && head_int8_.data) {
    gemm_int8(x_bf16_.data(), m, k, head_int8_, {y, DType::kF32, ldy}, pool_);
  } else if (auto it = packed_bf16_.find(w.data); it != packed_bf16_.end()) {
    gemm_bf16_packed(x_bf16_.data(), m, k, it->second, y, ldy, pool_);
  } else {
    gemm_bf16(x_bf16_.data(), m, k, reinterpret_cast<const uint16_t*>(w.data), w.rows, k, k, y, ldy,
              pool_);
  }
}

namespace {

// The new tokens of a batch, or why its positions or requested rows do not fit.
Result<int64_t> batch_rows(std::span<const StepSequence> batch) {
  int64_t n = 0;
  for (const StepSequence& s : batch) {
    int64_t end = s.start_pos + int64_t(s.tokens.size());
    if (s.start_pos < 0 || end > int64_t(s.block_table.size()) * kKvBlockSize) {
      return InvalidArgument(fmt::format("positions [{}, {}) exceed the block table ({} blocks)",
                                         s.start_pos, end, s.block_table.size()));
    }
    if (s.n_logits < 0 || s.hidden_rows() > int64_t(s.tokens.size())) {
      return InvalidArgument(fmt::format("rows of {} positions asked of a run of {} tokens",
                                         s.hidden_rows(), s.tokens.size()));
    }
    n += int64_t(s.tokens.size());
  }
  return n;
}

}  // namespace

Status DeepseekModel::forward(std::span<const StepSequence> batch, KvCache& cache,
                              StepOutput* out) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  ASSIGN_OR_RETURN(const int64_t n, batch_rows(batch));

  std::vector<float> x(size_t(n * H));  // [n, H] residual stream
  int64_t row = 0;
  for (const StepSequence& s : batch) {
    for (int32_t t : s.tokens) weights_.embed.row_to_f32(t, &x[size_t(row++ * H)]);
  }

  // Expert parallelism with overlap: two micro-batches interleaved (microbatch.cpp); else the
  // sequential driver, each layer's stages in order.
  if (overlap_ && dispatcher_.world_size() > 1) {
    RETURN_IF_ERROR(layers_overlapped(batch, cache, x));
  } else {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      RETURN_IF_ERROR(layer_sequential(l, batch, cache, x.data(), n));
    }
  }
  head(batch, x.data(), weights_.norm, out);
  return Status::Ok();
}

Status DeepseekModel::forward_mtp(std::span<const StepSequence> batch, const float* hidden,
                                  KvCache& cache, StepOutput* out) {
  CHECK(weights_.mtp.has_value(), "forward_mtp on a model loaded without its MTP module");
  const MtpWeights& m = *weights_.mtp;
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  ASSIGN_OR_RETURN(const int64_t n, batch_rows(batch));
  TraceSpan span(tracer_, "mtp");

  // [n, 2H]: RMSNorm_enorm(embed(t_{p+1})), then RMSNorm_hnorm(H_p): the embedding first.
  std::vector<float> eh(size_t(n * 2 * H));
  int64_t row = 0;
  for (const StepSequence& s : batch) {
    for (int32_t t : s.tokens) weights_.embed.row_to_f32(t, &eh[size_t(row++ * 2 * H)]);
  }
  norm(eh.data(), n, H, 2 * H, m.enorm.data(), eps, eh.data(), 2 * H);
  norm(hidden, n, H, H, m.hnorm.data(), eps, eh.data() + H, 2 * H);
  std::vector<float> x(size_t(n * H));  // [n, H] the decoder layer's input
  linear(eh.data(), n, 2 * H, m.eh_proj, x.data(), H);
  RETURN_IF_ERROR(layer_sequential(c.num_hidden_layers, batch, cache, x.data(), n));
  head(batch, x.data(), m.head_norm, out);
  return Status::Ok();
}

Status DeepseekModel::layer_sequential(int64_t l, std::span<const StepSequence> batch,
                                       KvCache& cache, float* x, int64_t n) {
  const int64_t H = config_.hidden_size, k = config_.num_experts_per_tok;
  std::vector<float>& h = scratch_.h;  // [n, H], as tmp (scratch: see ExpertScratch)
  std::vector<float>& tmp = scratch_.tmp;
  h.resize(size_t(n * H));
  tmp.resize(size_t(n * H));
  attention_stage(l, -1, batch, cache, x, h.data(), tmp.data(), n);
  if (!weights_.layers[size_t(l)].moe) {
    mlp_stage(l, -1, h.data(), x, tmp.data(), n);
    return Status::Ok();
  }
  std::vector<int32_t>& ids = scratch_.ids;  // [n, k]
  std::vector<float>& wts = scratch_.wts;    // [n, k]
  ids.resize(size_t(n * k));
  wts.resize(size_t(n * k));
  scratch_.shared.resize(size_t(n * H));  // [n, H] shared experts' output
  gate_stage(l, -1, h.data(), n, ids.data(), wts.data());
  std::optional<StageSpan> comm(std::in_place, tracer_, "dispatch", l, -1, TraceLane::kComm);
  ASSIGN_OR_RETURN(ExpertBatch b, dispatcher_.dispatch(moe_layer_index(l), h.data(), n, H,
                                                       ids.data(), wts.data(), k));
  comm.reset();
  RETURN_IF_ERROR(experts_stage(l, -1, b, scratch_.expert_out));
  comm.emplace(tracer_, "combine", l, -1, TraceLane::kComm);
  RETURN_IF_ERROR(combine(b, scratch_.expert_out, tmp.data()));  // [n, H]
  comm.reset();
  shared_stage(l, -1, h.data(), n, scratch_.shared.data());
  moe_residual(l, x, tmp.data(), scratch_.shared.data(), n);
  return Status::Ok();
}

void DeepseekModel::head(std::span<const StepSequence> batch, const float* x,
                         const std::vector<float>& norm_w, StepOutput* out) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  TraceSpan head_span(tracer_, "lm_head");
  int64_t n_hidden = 0, n_logits = 0;
  for (const StepSequence& s : batch) {
    n_hidden += s.hidden_rows();
    n_logits += s.n_logits;
  }
  out->hidden.resize(size_t(n_hidden * H));  // [n_hidden, H] final-norm'd requested rows
  // The rows with logits, [n_logits, H]: the hidden rows themselves when every hidden row has
  // logits (no MTP), else a gathered copy.
  std::vector<float> gathered;
  if (n_hidden != n_logits) gathered.resize(size_t(n_logits * H));
  int64_t row = 0, out_row = 0, logit_row = 0;
  for (const StepSequence& s : batch) {
    row += int64_t(s.tokens.size());
    for (int64_t r = row - s.hidden_rows(); r < row; ++r, ++out_row) {
      float* y = &out->hidden[size_t(out_row * H)];
      norm(&x[size_t(r * H)], 1, H, H, norm_w.data(), float(c.rms_norm_eps), y, H);
      if (!gathered.empty() && r >= row - s.n_logits) {
        std::copy_n(y, H, &gathered[size_t(logit_row++ * H)]);
      }
    }
  }
  const float* head_in = gathered.empty() ? out->hidden.data() : gathered.data();
  out->logits.assign(size_t(n_logits * c.vocab_size), 0.0f);  // [n_logits, vocab]
  const std::vector<int32_t>& live = compact_head_.rows;
  if (path_ == ComputePath::kFast && !live.empty() && n_logits > 0) {
    const int64_t n_live = int64_t(live.size());
    x_bf16_.resize(size_t(n_logits * H));
    f32_to_bf16_row(head_in, n_logits * H, x_bf16_.data());
    std::vector<float> y(size_t(n_logits * n_live));  // [n_logits, live rows]
    if (compact_head_.int8.data) {
      gemm_int8(x_bf16_.data(), n_logits, H, compact_head_.int8, {y.data(), DType::kF32, n_live},
                pool_);
    } else {
      gemm_bf16_packed(x_bf16_.data(), n_logits, H, compact_head_.packed, y.data(), n_live, pool_);
    }
    for (int64_t i = 0; i < n_logits; ++i) {
      float* l = &out->logits[size_t(i * c.vocab_size)];
      for (int64_t j = 0; j < n_live; ++j) l[live[size_t(j)]] = y[size_t(i * n_live + j)];
    }
    return;
  }
  linear(head_in, n_logits, H, weights_.lm_head, out->logits.data(), c.vocab_size);
}

void DeepseekModel::norm(const float* x, int64_t n, int64_t d, int64_t ldx, const float* w,
                         float eps, float* y, int64_t ldy) const {
  (path_ == ComputePath::kFast ? rmsnorm : rmsnorm_ref)(x, n, d, ldx, w, eps, y, ldy);
}

// ---- The stages of one decoder layer ----

void DeepseekModel::attention_stage(int64_t l, int mb, std::span<const StepSequence> batch,
                                    KvCache& cache, float* x, float* h, float* tmp, int64_t n) {
  const int64_t H = config_.hidden_size;
  const float eps = float(config_.rms_norm_eps);
  const LayerWeights& L = weights_.layers[size_t(l)];
  norm(x, n, H, H, L.attn_norm.data(), eps, h, H);  // [n, H]
  {
    StageSpan span(tracer_, "attention", l, mb);
    attention(l, batch, h, n, cache, tmp);  // [n, H]
  }
  add_into(x, tmp, n * H);
  norm(x, n, H, H, L.ffn_norm.data(), eps, h, H);  // [n, H] the ffn's input
}

void DeepseekModel::mlp_stage(int64_t l, int mb, const float* h, float* x, float* tmp, int64_t n) {
  {
    StageSpan span(tracer_, "mlp", l, mb);
    mlp(*weights_.layers[size_t(l)].mlp, h, n, tmp);  // [n, H]
  }
  add_into(x, tmp, n * config_.hidden_size);
}

void DeepseekModel::shared_stage(int64_t l, int mb, const float* h, int64_t n, float* shared) {
  const MoeWeights& w = *weights_.layers[size_t(l)].moe;
  if (!w.shared) return;
  StageSpan span(tracer_, "shared experts", l, mb);
  mlp(*w.shared, h, n, shared);  // [n, H]
}

// out = routed + shared, then the residual: the same additions in the same order for both
// drivers.
void DeepseekModel::moe_residual(int64_t l, float* x, float* routed, const float* shared,
                                 int64_t n) {
  const int64_t H = config_.hidden_size;
  if (weights_.layers[size_t(l)].moe->shared) add_into(routed, shared, n * H);
  add_into(x, routed, n * H);
}

void DeepseekModel::attention(int64_t layer, std::span<const StepSequence> batch, const float* x,
                              int64_t n, KvCache& cache, float* out) {
  const ModelConfig& c = config_;
  const AttentionWeights& A = weights_.layers[size_t(layer)].attn;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  const int64_t dn = c.qk_nope_head_dim, dv = c.v_head_dim, dq = c.qk_head_dim();
  const int64_t R = c.kv_lora_rank, D = c.kv_cache_dim();

  // Buffers reused across layers and steps (attn_scratch_: tens of MB in a prefill step, which
  // fresh allocations would page-fault in again for every layer); every element is written
  // before it is read.
  std::vector<float>& q = attn_scratch_.q;  // [n, nh, dn + dr]
  q.resize(size_t(n * nh * dq));
  if (A.q_a) {
    const int64_t QR = A.q_a->rows;
    std::vector<float>& qa = attn_scratch_.q_lora;  // [n, q_lora_rank]
    qa.resize(size_t(n * QR));
    linear(x, n, H, *A.q_a, qa.data(), QR);
    norm(qa.data(), n, QR, QR, A.q_a_norm.data(), kLoraNormEps, qa.data(), QR);
    linear(qa.data(), n, QR, A.q_b, q.data(), nh * dq);
  } else {
    linear(x, n, H, A.q_b, q.data(), nh * dq);
  }
  std::vector<float>& kv = attn_scratch_.kv;  // [n, R + dr]: latent, then the shared rope key
  kv.resize(size_t(n * D));
  linear(x, n, H, A.kv_a, kv.data(), D);
  norm(kv.data(), n, R, D, A.kv_a_norm.data(), kLoraNormEps, kv.data(), D);

  int64_t row = 0;
  for (const StepSequence& s : batch) {
    for (size_t i = 0; i < s.tokens.size(); ++i, ++row) {
      int64_t pos = s.start_pos + int64_t(i);
      if (path_ == ComputePath::kFast) {                                // the same bits, vectorized
        rope_.apply_fast(&q[size_t(row * nh * dq + dn)], nh, dq, pos);  // q_pe of every head
        rope_.apply_fast(&kv[size_t(row * D + R)], 1, D, pos);          // k_pe
      } else {
        rope_.apply(&q[size_t(row * nh * dq + dn)], nh, dq, pos);  // q_pe of every head
        rope_.apply(&kv[size_t(row * D + R)], 1, D, pos);          // k_pe
      }
      cache.write(layer, s.block_table, pos, &kv[size_t(row * D)]);
    }
  }

  std::vector<float>& o = attn_scratch_.o;  // [n, nh, dv]
  o.resize(size_t(n * nh * dv));
  if (path_ == ComputePath::kFast && mode_ == AttentionMode::kAbsorbed) {
    attend_absorbed_fast(layer, batch, q.data(), n, cache, o.data());
    linear(o.data(), n, nh * dv, A.o, out, H);  // [n, H]
    return;
  }
  std::vector<float> kv_b(size_t(A.kv_b.rows * R));  // [nh * (dn + dv), R] dequantized
  for (int64_t r = 0; r < A.kv_b.rows; ++r) A.kv_b.row_to_f32(r, &kv_b[size_t(r * R)]);

  row = 0;
  for (const StepSequence& s : batch) {
    attend_sequence(layer, s, &q[size_t(row * nh * dq)], nh * dq, cache, kv_b,
                    &o[size_t(row * nh * dv)], nh * dv);
    row += int64_t(s.tokens.size());
  }
  linear(o.data(), n, nh * dv, A.o, out, H);  // [n, H]
}

// Absorbed attention on the fast path: q_lat = W_UK^T q_nope per head (FP32 GEMM against
// matrices dequantized at construction), the paged MLA kernel over the cache, then
// o = W_UV o_lat per head.
void DeepseekModel::attend_absorbed_fast(int64_t layer, std::span<const StepSequence> batch,
                                         const float* q, int64_t n, const KvCache& cache,
                                         float* o) {
  const ModelConfig& c = config_;
  const int64_t nh = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim, dq = c.qk_head_dim(), R = c.kv_lora_rank, D = c.kv_cache_dim();
  const AbsorbedWeights& W = absorbed_[size_t(layer)];

  std::vector<float>& qa = attn_scratch_.q_lat;  // [n, nh, R + dr] absorbed queries
  qa.resize(size_t(n * nh * D));
  // Heads in parallel (one pool pass per projection, not one per head).
  auto q_heads = [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t i = 0; i < n; ++i) {
        std::copy_n(q + (i * nh + h) * dq + dn, dr, &qa[size_t((i * nh + h) * D + R)]);  // q_pe
      }
      if (!W.uk_t_fp8.empty()) {  // q_lat [n, R] of head h = q_nope W_UK
        gemm_fp8_f32x(q + h * dq, n, nh * dq, W.uk_t_fp8[size_t(h)],
                      GemmOutput{&qa[size_t(h * D)], DType::kF32, nh * D}, nullptr);
        continue;
      }
      gemm_f32_kn(q + h * dq, n, nh * dq, &W.uk[size_t(h * dn * R)], R, dn, R, &qa[size_t(h * D)],
                  nh * D, nullptr);
    }
  };
  pool_ ? pool_->parallel_for(nh, q_heads) : q_heads(0, nh);

  std::vector<float>& o_lat = attn_scratch_.o_lat;  // [n, nh, R]
  o_lat.resize(size_t(n * nh * R));
  MlaShape shape{nh, R, dr, float(c.softmax_scale())};
  const MlaCacheView view{.blocks = cache.layer_base(layer),
                          .token = cache.layout().token,
                          .num_blocks = cache.num_blocks(),
                          .block_stride = cache.block_stride_bytes()};
  // The whole step in one kernel call (one pass over the pool, not one per sequence), with
  // every sequence's KV cut at fixed 4-block (256-token) boundaries: a sequence's split, and so
  // its rounding, never depends on what else is in the batch.
  std::vector<MlaSequence> seqs;
  for (const StepSequence& s : batch) {
    const int64_t len = int64_t(s.tokens.size());
    if (len > 0) seqs.push_back(MlaSequence{s.block_table, s.start_pos + len, len});
  }
  MlaOptions mla_options;
  mla_options.split_blocks = 4;
  MlaBatch mb{shape, view, seqs, qa.data(), DType::kF32, o_lat.data(), nullptr};
  mla_decode(mb, pool_, mla_options);

  auto o_heads = [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {  // o [n, dv] of head h = o_lat W_UV^T
      if (!W.uv_fp8.empty()) {
        gemm_fp8_f32x(&o_lat[size_t(h * R)], n, nh * R, W.uv_fp8[size_t(h)],
                      GemmOutput{o + h * dv, DType::kF32, nh * dv}, nullptr);
        continue;
      }
      gemm_f32_kn(&o_lat[size_t(h * R)], n, nh * R, &W.uv_t[size_t(h * R * dv)], dv, R, dv,
                  o + h * dv, nh * dv, nullptr);
    }
  };
  pool_ ? pool_->parallel_for(nh, o_heads) : o_heads(0, nh);
}

void DeepseekModel::attend_sequence(int64_t layer, const StepSequence& s, const float* q,
                                    int64_t ldq, const KvCache& cache,
                                    const std::vector<float>& kv_b, float* o, int64_t ldo) {
  const ModelConfig& c = config_;
  const int64_t nh = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim, dq = c.qk_head_dim(), R = c.kv_lora_rank, D = c.kv_cache_dim();
  const int64_t n_new = int64_t(s.tokens.size());
  const int64_t T = s.start_pos + n_new;
  const float scale = float(c.softmax_scale());
  if (n_new == 0) return;

  std::vector<float> ctx(size_t(T * D));  // [T, R + dr] cached latents and rope keys
  for (int64_t t = 0; t < T; ++t) cache.read(layer, s.block_table, t, &ctx[size_t(t * D)]);

  std::vector<float> kvx;  // naive only: [T, nh, dn + dv] per-head keys (nope part) and values
  if (mode_ == AttentionMode::kNaive) {
    const int64_t W = nh * (dn + dv);
    kvx.resize(size_t(T * W));
    auto expand = [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t r = 0; r < W; ++r) {
          kvx[size_t(t * W + r)] = dot(&ctx[size_t(t * D)], &kv_b[size_t(r * R)], R);
        }
      }
    };
    pool_ ? pool_->parallel_for(T, expand) : expand(0, T);
  }

  auto heads = [&](int64_t h0, int64_t h1) {
    std::vector<float> scores(static_cast<size_t>(T)), q_lat(static_cast<size_t>(R)),
        o_lat(static_cast<size_t>(R));
    for (int64_t h = h0; h < h1; ++h) {
      const float* wk = &kv_b[size_t(h * (dn + dv) * R)];         // [dn, R] key rows of head h
      const float* wv = &kv_b[size_t((h * (dn + dv) + dn) * R)];  // [dv, R] value rows
      for (int64_t i = 0; i < n_new; ++i) {
        const float* qh = q + i * ldq + h * dq;     // [dn + dr]
        const int64_t n_ctx = s.start_pos + i + 1;  // causal: positions [0, pos]
        float* oh = o + i * ldo + h * dv;           // [dv]
        if (mode_ == AttentionMode::kNaive) {
          const int64_t W = nh * (dn + dv);
          for (int64_t t = 0; t < n_ctx; ++t) {
            const float* k = &kvx[size_t(t * W + h * (dn + dv))];
            scores[size_t(t)] =
                (dot(qh, k, dn) + dot(qh + dn, &ctx[size_t(t * D + R)], dr)) * scale;
          }
          softmax(scores.data(), n_ctx);
          std::fill(oh, oh + dv, 0.0f);
          for (int64_t t = 0; t < n_ctx; ++t) {
            const float* v = &kvx[size_t(t * W + h * (dn + dv) + dn)];
            for (int64_t j = 0; j < dv; ++j) oh[j] += scores[size_t(t)] * v[j];
          }
        } else {
          // q_lat = W_k^T q_nope: [R]
          std::fill(q_lat.begin(), q_lat.end(), 0.0f);
          for (int64_t d = 0; d < dn; ++d) {
            for (int64_t r = 0; r < R; ++r) q_lat[size_t(r)] += qh[d] * wk[d * R + r];
          }
          for (int64_t t = 0; t < n_ctx; ++t) {
            const float* kt = &ctx[size_t(t * D)];
            scores[size_t(t)] = (dot(q_lat.data(), kt, R) + dot(qh + dn, kt + R, dr)) * scale;
          }
          softmax(scores.data(), n_ctx);
          std::fill(o_lat.begin(), o_lat.end(), 0.0f);  // [R] attention-weighted latent
          for (int64_t t = 0; t < n_ctx; ++t) {
            const float* kt = &ctx[size_t(t * D)];
            for (int64_t r = 0; r < R; ++r) o_lat[size_t(r)] += scores[size_t(t)] * kt[r];
          }
          for (int64_t j = 0; j < dv; ++j) oh[j] = dot(wv + j * R, o_lat.data(), R);
        }
      }
    }
  };
  pool_ ? pool_->parallel_for(nh, heads) : heads(0, nh);
}

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
