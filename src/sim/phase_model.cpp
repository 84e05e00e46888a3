#include "sim/phase_model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace moeserve::sim {

namespace {

std::vector<OpCost> calibrated(std::vector<OpCost> ops, const Calibration& c) {
  if (!c.active) return ops;
  for (auto& op : ops) op.seconds *= c.op_scale[size_t(op.group)];
  return ops;
}

// DeepSeek's decode schedule for two micro-batches a and b (profile-data decode figure):
// [SHARED(a) + ATTN-0(b) | dispatch(a)], [MLP(a)], [ATTN-1(b) | combine(a)], then the same with
// a and b swapped. The routed MLP has no all-to-all under it.
double staged_decode_layer_s(const std::vector<OpCost>& ops) {
  std::array<double, kOpGroups> g{};
  for (const auto& op : ops) g[size_t(op.group)] += op.seconds;
  auto at = [&](OpGroup x) { return g[size_t(x)]; };
  double first = std::max(at(OpGroup::kShared) + at(OpGroup::kAttnPre), at(OpGroup::kDispatch));
  double last = std::max(at(OpGroup::kAttnCore) + at(OpGroup::kAttnPost) + at(OpGroup::kGate),
                         at(OpGroup::kCombine));
  return 2 * (first + at(OpGroup::kRouted) + last);
}

StepTime layer_time(const std::vector<OpCost>& raw_ops, int micro_batches, bool overlap,
                    double compute_share, const Calibration& cal = {}, bool decode = false) {
  const std::vector<OpCost> ops = calibrated(raw_ops, cal);
  StepTime t;
  for (const auto& op : ops) (op.comm ? t.comm_s : t.compute_s) += op.seconds;
  bool overlapped = overlap && micro_batches >= 2 && t.comm_s > 0;
  if (overlapped && decode && cal.active && cal.staged_decode && micro_batches == 2) {
    t.compute_s *= micro_batches;
    t.comm_s *= micro_batches;
    t.total_s = staged_decode_layer_s(ops);
    return t;
  }
  // While the other micro-batch's all-to-all runs, its kernels hold part of the device.
  if (overlapped && compute_share > 0 && compute_share < 1) t.compute_s /= compute_share;
  t.compute_s *= micro_batches;
  t.comm_s *= micro_batches;
  t.total_s = overlapped ? std::max(t.compute_s, t.comm_s) : t.compute_s + t.comm_s;
  return t;
}

void add(StepTime* acc, const StepTime& t, double times) {
  acc->compute_s += t.compute_s * times;
  acc->comm_s += t.comm_s * times;
  acc->total_s += t.total_s * times;
}

ExpertLayout layout(const Hardware& hw, const UnitDeployment& u, CommMode mode) {
  return {u.ep, u.redundant_experts, hw.node.devices, mode, u.expert_imbalance};
}

int micro_batches(const UnitDeployment& u) {
  return std::max(1, u.micro_batches);
}

double attention_params(const ModelSpec& m) {
  double h = m.hidden;
  double q = m.q_lora_rank > 0
                 ? h * m.q_lora_rank + double(m.q_lora_rank) * m.heads * m.qk_head_dim()
                 : h * m.heads * m.qk_head_dim();
  double kv =
      h * m.kv_cache_width() + double(m.kv_lora_rank) * m.heads * (m.qk_nope_dim + m.v_head_dim);
  double o = double(m.heads) * m.v_head_dim * h;
  return q + kv + o;
}

// All transformer layers of the main model over micro-batch `mb`: V3's dense then MoE layers,
// or V4's sliding, CSA and HCA layers.
StepTime all_layers(const ModelSpec& m, const Hardware& hw, const ExpertLayout& e,
                    const MicroBatch& mb, int nmb, bool overlap, double moe_compute_share,
                    const Calibration& cal, bool decode) {
  StepTime acc;
  auto kind = [&](bool moe, int ratio, double share, int count) {
    if (count <= 0) return;
    add(&acc,
        layer_time(layer_ops(m, hw.device, hw.node, e, mb, moe, ratio), nmb, overlap, share, cal,
                   decode),
        count);
  };
  if (m.v4()) {
    kind(true, 0, moe_compute_share, m.sliding_layers);
    kind(true, m.csa_ratio, moe_compute_share, m.csa_layers);
    kind(true, m.hca_ratio, moe_compute_share, m.hca_layers);
  } else {
    kind(false, 0, 1, m.first_dense_layers);
    kind(true, 0, moe_compute_share, m.moe_layers());
  }
  return acc;
}

// A decode micro-batch of `seqs` sequences with `s_q` query tokens each at context kv_len.
MicroBatch decode_micro_batch(const ModelSpec& m, double seqs, double s_q, double kv_len) {
  MicroBatch mb{seqs * s_q, seqs, seqs * s_q * kv_len, seqs * kv_len, true};
  if (m.v4()) {
    V4Counts one = v4_counts(m, kv_len);
    mb.v4_pairs = one * (seqs * s_q);
    // Window, HCA entries and index keys are read once per sequence; each query token reads
    // its own top-k picks.
    mb.v4_reads = one * seqs;
    mb.v4_reads.csa = one.csa * seqs * s_q;
  }
  return mb;
}

}  // namespace

double kv_bytes_per_token(const ModelSpec& m) {
  if (m.v4()) {
    double entry = m.v4_entry_bytes(), key = m.v4_index_key_bytes();
    return m.csa_layers * (entry + key) / m.csa_ratio + m.hca_layers * entry / m.hca_ratio;
  }
  return double(m.layers + m.mtp_layers) * m.kv_cache_width() * 2.0;  // BF16 latent + rope key
}

double kv_bytes_per_sequence_fixed(const ModelSpec& m) {
  if (!m.v4()) return 0;
  // Every layer's window (the MTP layer's too): sliding_window entries.
  double window = double(m.layers + m.mtp_layers) * m.sliding_window * m.v4_entry_bytes();
  // Compressor state as DeepSeek's model.py keeps it, F32 kv and score per slot: CSA
  // (overlapping) 2 ratio slots x 2 head_dim for the main compressor and 2 index_head_dim for
  // the indexer's; HCA ratio slots x head_dim.
  double csa_state = 2.0 * (2.0 * m.csa_ratio) * (2.0 * m.head_dim) * 4 +
                     2.0 * (2.0 * m.csa_ratio) * (2.0 * m.index_head_dim) * 4;
  double hca_state = 2.0 * m.hca_ratio * m.head_dim * 4;
  return window + m.csa_layers * csa_state + m.hca_layers * hca_state;
}

double weight_bytes_per_device(const ModelSpec& m, const UnitDeployment& u) {
  if (m.v4()) {
    ExpertLayout e{u.ep, u.redundant_experts, 8, CommMode::kNormal, 1.0};
    const double h = m.hidden;
    double expert = 3.0 * h * m.moe_intermediate * m.routed_weight_bytes;
    double routed = experts_per_device(m, e) * expert;
    double layers = m.sliding_layers * (v4_layer_resident_bytes(m, 0) + routed) +
                    m.csa_layers * (v4_layer_resident_bytes(m, m.csa_ratio) + routed) +
                    m.hca_layers * (v4_layer_resident_bytes(m, m.hca_ratio) + routed);
    // MTP: one layer of its ratio plus e_proj and h_proj (FP8 D x D each).
    double mtp =
        m.mtp_layers * (v4_layer_resident_bytes(m, m.mtp_compress_ratio) + routed + 2.0 * h * h);
    double embed_and_head = 2.0 * m.vocab * h * 2.0;  // BF16
    return layers + mtp + embed_and_head;
  }
  ExpertLayout e{u.ep, u.redundant_experts, 8, CommMode::kNormal, 1.0};
  double h = m.hidden;
  double expert = 3.0 * h * m.moe_intermediate;  // gate, up, down; FP8: one byte each
  double moe_layer = attention_params(m) + m.shared_experts * expert +
                     experts_per_device(m, e) * expert + 2.0 * m.routed_experts * h;  // BF16 gate
  double dense_layer = attention_params(m) + 3.0 * h * m.dense_intermediate;
  double mtp_layer = moe_layer + 2.0 * h * h;       // eh_proj
  double embed_and_head = 2.0 * m.vocab * h * 2.0;  // BF16
  return m.first_dense_layers * dense_layer + m.moe_layers() * moe_layer +
         m.mtp_layers * mtp_layer + embed_and_head;
}

std::vector<OpCost> decode_layer_breakdown(const ModelSpec& m, const Hardware& hw,
                                           const UnitDeployment& u, double batch, double kv_len) {
  double s_q = 1.0 + u.mtp_draft_tokens;
  double seqs = batch / micro_batches(u);
  MicroBatch mb = decode_micro_batch(m, seqs, s_q, kv_len);
  // V4: a CSA layer (the costliest kind).
  return calibrated(layer_ops(m, hw.device, hw.node, layout(hw, u, CommMode::kLowLatency), mb, true,
                              m.v4() ? m.csa_ratio : 0),
                    u.calibration);
}

DecodePoint decode_at(const ModelSpec& m, const Hardware& hw, const UnitDeployment& u, double batch,
                      double kv_len) {
  DecodePoint p;
  p.batch = batch;
  p.kv_bytes_per_seq = kv_bytes_per_token(m) * kv_len + kv_bytes_per_sequence_fixed(m);
  double budget =
      hw.device.mem_bytes * hw.device.mem_usable_fraction - weight_bytes_per_device(m, u);
  p.max_batch_by_memory = budget > 0 ? std::floor(budget / p.kv_bytes_per_seq) : 0;

  const int nmb = micro_batches(u);
  const ExpertLayout e = layout(hw, u, CommMode::kLowLatency);
  const double s_q = 1.0 + u.mtp_draft_tokens;  // query tokens per sequence per step
  const double seqs = batch / nmb;
  const MicroBatch mb = decode_micro_batch(m, seqs, s_q, kv_len);
  const Calibration& cal = u.calibration;
  p.layers = all_layers(m, hw, e, mb, nmb, u.overlap, 1, cal, true);
  p.layers.total_s *= cal.layers_scale;

  double head = lm_head_op(m, hw.device, batch * s_q).seconds;
  // MTP: per drafted token, the MTP module (eh_proj + one MoE layer per MTP layer + lm_head)
  // runs once over one token per sequence.
  double mtp = 0;
  if (m.mtp_layers > 0 && u.mtp_draft_tokens > 0) {
    MicroBatch one = decode_micro_batch(m, seqs, 1, kv_len);
    StepTime layer = layer_time(
        layer_ops(m, hw.device, hw.node, e, one, true, m.v4() ? m.mtp_compress_ratio : 0), nmb,
        u.overlap, 1, cal, true);
    // V3: eh_proj [2D -> D]; V4: e_proj on the embedding and h_proj on each of the hc streams.
    GemmShape eh = m.v4() ? GemmShape{batch * (1.0 + m.hc_mult), double(m.hidden), double(m.hidden)}
                          : GemmShape{batch, double(m.hidden), 2.0 * m.hidden};
    double per_draft = m.mtp_layers * layer.total_s +
                       fp8_gemm_seconds(hw.device, GemmKind::kDense, eh) +
                       lm_head_op(m, hw.device, batch).seconds;
    mtp = u.mtp_draft_tokens * per_draft;
  }
  p.head_and_mtp_s = (head + mtp) * cal.head_scale;
  p.step_s = p.layers.total_s + p.head_and_mtp_s;

  // Draft i is kept only if drafts 1..i all are: 1 + p + p^2 + ... tokens per step.
  p.tokens_per_step = 1.0;
  double chain = 1.0;
  for (int i = 0; i < u.mtp_draft_tokens; ++i) {
    chain *= u.mtp_acceptance;
    p.tokens_per_step += chain;
  }
  p.user_tokens_per_s = p.tokens_per_step / p.step_s;
  p.device_tokens_per_s = batch * p.user_tokens_per_s;
  return p;
}

Result<DecodePoint> decode_operating_point(const ModelSpec& m, const Hardware& hw,
                                           const UnitDeployment& u, double kv_len,
                                           double min_user_tokens_per_s) {
  if (kv_len <= 0) return InvalidArgument("decode KV length must be positive");
  DecodePoint probe = decode_at(m, hw, u, 1, kv_len);
  double max_batch = probe.max_batch_by_memory;
  if (max_batch < 1) {
    return ResourceExhausted(fmt::format(
        "decode: weights ({:.1f} GB per device) leave no room for the KV cache of one sequence "
        "({:.2f} GB) in {:.1f} GB usable",
        weight_bytes_per_device(m, u) / 1e9, probe.kv_bytes_per_seq / 1e9,
        hw.device.mem_bytes * hw.device.mem_usable_fraction / 1e9));
  }
  if (u.batch_per_device) {
    double b = *u.batch_per_device;
    if (b <= 0) return InvalidArgument("decode batch_per_device must be positive");
    if (b > max_batch) {
      return ResourceExhausted(fmt::format(
          "decode batch {} per device does not fit: memory holds {} sequences of {:.0f} tokens", b,
          max_batch, kv_len));
    }
    return decode_at(m, hw, u, b, kv_len);
  }
  if (probe.user_tokens_per_s < min_user_tokens_per_s) {
    return ResourceExhausted(fmt::format(
        "decode: even one sequence per device runs at {:.1f} tokens/s, below the target {:.1f}",
        probe.user_tokens_per_s, min_user_tokens_per_s));
  }
  // Per-sequence speed falls as the batch grows: the largest batch meeting the target.
  double lo = 1, hi = max_batch;
  if (decode_at(m, hw, u, hi, kv_len).user_tokens_per_s >= min_user_tokens_per_s) lo = hi;
  while (hi - lo > 1) {
    double mid = std::floor((lo + hi) / 2);
    if (decode_at(m, hw, u, mid, kv_len).user_tokens_per_s >= min_user_tokens_per_s) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return decode_at(m, hw, u, lo, kv_len);
}

Result<PrefillPoint> prefill_at(const ModelSpec& m, const Hardware& hw, const UnitDeployment& u,
                                const std::vector<PromptBucket>& prompts, double cache_hit) {
  if (prompts.empty()) return InvalidArgument("prefill: no prompt lengths given");
  if (cache_hit < 0 || cache_hit >= 1) return InvalidArgument("cache hit ratio must be in [0, 1)");
  // Token-weighted averages over the new (computed) tokens of all prompts.
  double new_tokens = 0, ctx = 0, expand = 0, heads = 0;
  V4Counts v4;  // V4: attention counts summed over the new tokens, weighted like ctx
  for (const auto& b : prompts) {
    if (b.tokens < 1 || b.fraction < 0)
      return InvalidArgument("prompt bucket: bad tokens/fraction");
    double cached = cache_hit * b.tokens;
    double fresh = b.tokens - cached;
    double w = b.fraction * fresh;
    new_tokens += w;
    ctx += w * (cached + (fresh + 1) / 2);  // causal: the i-th new token sees cached + i
    expand += b.fraction * cached;          // cached prefix expanded once per prompt
    heads += b.fraction;                    // one lm_head row per prompt
    if (m.v4()) v4 = v4 + v4_counts_causal(m, cached, fresh) * b.fraction;
  }
  if (new_tokens <= 0) return InvalidArgument("prefill: prompt fractions sum to zero");
  double avg_ctx = ctx / new_tokens, expand_per_token = expand / new_tokens;
  double prompts_per_token = heads / new_tokens;

  PrefillPoint p;
  p.cache_hit = cache_hit;
  p.tokens_per_forward = u.batch_per_device.value_or(16384);
  if (p.tokens_per_forward <= 0)
    return InvalidArgument("prefill tokens per device must be positive");
  const int nmb = micro_batches(u);
  const double t = p.tokens_per_forward / nmb;
  MicroBatch mb{t, t * prompts_per_token, t * avg_ctx, t * expand_per_token, false};
  if (m.v4()) mb.v4_pairs = v4 * (t / new_tokens);  // no prefix expansion: entries are cached
  const ExpertLayout e = layout(hw, u, CommMode::kNormal);
  p.layers = all_layers(m, hw, e, mb, nmb, u.overlap, u.compute_share, Calibration{}, false);
  p.forward_s =
      p.layers.total_s + lm_head_op(m, hw.device, p.tokens_per_forward * prompts_per_token).seconds;
  p.forward_s *= u.calibration.forward_scale;
  p.computed_tokens_per_s = p.tokens_per_forward / p.forward_s;
  p.input_tokens_per_s = p.computed_tokens_per_s / (1.0 - cache_hit);
  return p;
}

}  // namespace moeserve::sim
