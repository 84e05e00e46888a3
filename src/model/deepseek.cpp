// The DeepSeek-V3/V2 forward pass, top to bottom: embed -> layers (attention + residual, dense
// MLP or MoE + residual) -> norm -> lm_head. The attention is MLA (deepseek_attention.cpp), the
// MoE layer's routing and experts are in deepseek_moe.cpp. Shapes in the comments use n = new
// tokens in the step, H = hidden_size, nh = heads, dn/dr/dv = qk_nope/qk_rope/v head dims,
// R = kv_lora_rank, T = context length.
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

void add_into(float* x, const float* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] += y[i];
}

}  // namespace

DeepseekModel::DeepseekModel(const ModelConfig& config, const ModelWeights& weights,
                             Dispatcher& dispatcher, ThreadPool* pool, AttentionMode mode,
                             ComputePath path, bool overlap, bool progress, WeightFormats formats,
                             const WeightCacheOptions& weight_cache)
    : config_(config),
      weights_(weights),
      dispatcher_(dispatcher),
      pool_(pool),
      mode_(mode),
      path_(path),
      overlap_(overlap),
      rope_(rope_params(config)),
      formats_(formats),
      experts_(config, weights, path == ComputePath::kFast ? &packed_ : nullptr,
               formats.expert_format()) {
  if (path_ == ComputePath::kFast) prepare_fast_path(progress, weight_cache);
}

KvLayout DeepseekModel::kv_layout(const ModelConfig& c, DType kv_dtype, bool mtp) {
  const int64_t n = c.num_hidden_layers + (mtp ? 1 : 0);
  const KvTokenFormat latent{kv_dtype, c.kv_lora_rank, c.qk_rope_head_dim};
  if (!c.indexer) return KvLayout(n, latent);
  // DSA: every layer also keeps the indexer's key per token (docs/dsa.md): FP8 with a scale as
  // DeepSeek's, or, in an F32 cache (the reference format), F32 as transformers' deepseek_v32.
  const DType key = kv_dtype == DType::kF32 ? DType::kF32 : DType::kF8E4M3;
  const KvLayerFormat layer{
      {KvPart::latent(latent), KvPart::index_key(c.indexer->head_dim, 1, key)}, 0};
  return KvLayout(std::vector<KvLayerFormat>(size_t(n), layer));
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
  } else if (&w == &weights_.lm_head && !head_.empty()) {
    head_.gemm(x_bf16_.data(), m, k, y, ldy, pool_);
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
    compact_head_.packed.gemm(x_bf16_.data(), n_logits, H, y.data(), n_live, pool_);
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

}  // namespace moeserve
