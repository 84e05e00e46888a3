#include "sim/layer_ops.h"

#include <algorithm>
#include <cmath>

namespace moeserve::sim {

namespace {

// Reads and writes of a [tokens, hidden] BF16 activation per layer outside the GEMMs: two
// RMSNorms (read + write each), two residual adds (read 2, write 1 each), the FP8 quantization
// of the attention and FFN inputs (read 1 each). 2 + 2 + 3 + 3 + 1 + 1 = 12.
constexpr double kElementwisePasses = 12;
// FP8 dispatch payload per value: 1 byte, plus one fp32 scale per 128 values.
constexpr double kFp8BytesPerValue = 1.0 + 4.0 / 128.0;

OpCost fp8_gemm(const char* name, const DeviceSpec& d, GemmKind kind, GemmShape s, OpGroup g) {
  return {name, gemm_flops(s), gemm_bytes(s, 1, 1), fp8_gemm_seconds(d, kind, s), false, g};
}

OpCost bf16_gemm(const char* name, const DeviceSpec& d, GemmShape s, OpGroup g) {
  return {name, gemm_flops(s), gemm_bytes(s, 2, 2), bf16_gemm_seconds(d, s), false, g};
}

}  // namespace

double experts_per_device(const ModelSpec& m, const ExpertLayout& e) {
  return (m.routed_experts + e.redundant_experts) / e.ep;
}

double tokens_per_expert(const ModelSpec& m, const ExpertLayout& e, double tokens) {
  // Every device sends tokens * k (token, expert) pairs; the EP group's pairs spread evenly
  // over routed + redundant expert slots.
  return e.ep * tokens * m.experts_per_token / (m.routed_experts + e.redundant_experts);
}

double expected_nodes_touched(double nodes, int k) {
  if (nodes <= 1) return 1;
  return nodes * (1.0 - std::pow(1.0 - 1.0 / nodes, k));
}

double dispatch_bytes(const ModelSpec& m, const ExpertLayout& e, double tokens) {
  double per_copy = m.hidden * kFp8BytesPerValue;
  if (e.comm == CommMode::kLowLatency) return tokens * m.experts_per_token * per_copy;
  double nodes = std::max(1.0, e.ep / e.devices_per_node);
  return tokens * expected_nodes_touched(nodes, m.experts_per_token) * per_copy;
}

double combine_bytes(const ModelSpec& m, const ExpertLayout& e, double tokens) {
  double per_copy = m.hidden * 2.0;
  if (e.comm == CommMode::kLowLatency) return tokens * m.experts_per_token * per_copy;
  double nodes = std::max(1.0, e.ep / e.devices_per_node);
  return tokens * expected_nodes_touched(nodes, m.experts_per_token) * per_copy;
}

std::vector<OpCost> layer_ops(const ModelSpec& m, const DeviceSpec& d, const NodeSpec& n,
                              const ExpertLayout& e, const MicroBatch& mb, bool moe) {
  std::vector<OpCost> ops;
  const double t = mb.tokens;
  const double h = m.hidden;
  const double heads = m.heads;
  if (t <= 0) return ops;

  // Norms, residual adds, activation quantization.
  double ew = kElementwisePasses * t * h * 2.0;
  ops.push_back({"elementwise", 0, ew, memory_seconds(d, ew), false, OpGroup::kAttnPre});

  // --- MLA projections. q_a and kv_a share their input and run as one GEMM (N = 1536 + 576).
  if (m.q_lora_rank > 0) {
    ops.push_back(fp8_gemm("q_a+kv_a_proj", d, GemmKind::kDense,
                           {t, double(m.q_lora_rank + m.kv_cache_width()), h}, OpGroup::kAttnPre));
    ops.push_back(fp8_gemm("q_b_proj", d, GemmKind::kDense,
                           {t, heads * m.qk_head_dim(), double(m.q_lora_rank)}, OpGroup::kAttnPre));
  } else {
    ops.push_back(fp8_gemm("q_proj", d, GemmKind::kDense, {t, heads * m.qk_head_dim(), h},
                           OpGroup::kAttnPre));
    ops.push_back(fp8_gemm("kv_a_proj", d, GemmKind::kDense, {t, double(m.kv_cache_width()), h},
                           OpGroup::kAttnPre));
  }

  if (mb.decode) {
    // Absorbed MLA: q_nope through W_UK into the latent space, attention over the latent cache
    // (MQA with 576-wide keys and 512-wide values), then W_UV back to v_head_dim per head.
    ops.push_back(bf16_gemm("absorb_q (W_UK)", d,
                            {t, double(m.kv_lora_rank), double(m.qk_nope_dim), heads},
                            OpGroup::kAttnPre));
    double flops = 2.0 * mb.attn_pairs * heads * (m.kv_cache_width() + m.kv_lora_rank);
    double bytes = mb.kv_tokens * m.kv_cache_width() * 2.0 +
                   t * heads * (m.kv_cache_width() + m.kv_lora_rank) * 2.0;
    double bw = d.attn_decode_bw > 0 ? d.attn_decode_bw : d.mem_bw * d.mem_bw_eff;
    double fl = d.attn_decode_flops > 0 ? d.attn_decode_flops : d.bf16_flops * d.gemm_compute_eff;
    ops.push_back({"core_attention (MLA decode)", flops, bytes, std::max(bytes / bw, flops / fl),
                   false, OpGroup::kAttnCore});
    ops.push_back(bf16_gemm("absorb_o (W_UV)", d,
                            {t, double(m.v_head_dim), double(m.kv_lora_rank), heads},
                            OpGroup::kAttnPost));
  } else {
    // Naive MLA: expand K (nope part) and V from the latent for the new tokens and for the
    // cached prefix they attend to, then multi-head attention with 192-wide q/k, 128-wide v.
    ops.push_back(
        fp8_gemm("kv_b_proj", d, GemmKind::kDense,
                 {t + mb.kv_tokens, heads * (m.qk_nope_dim + m.v_head_dim), double(m.kv_lora_rank)},
                 OpGroup::kAttnPre));
    double flops = 2.0 * mb.attn_pairs * heads * (m.qk_head_dim() + m.v_head_dim);
    double fl = d.attn_prefill_flops > 0 ? d.attn_prefill_flops : d.bf16_flops * d.gemm_compute_eff;
    ops.push_back(
        {"core_attention (MHA prefill)", flops, 0, flops / fl, false, OpGroup::kAttnCore});
  }
  ops.push_back(
      fp8_gemm("o_proj", d, GemmKind::kDense, {t, h, heads * m.v_head_dim}, OpGroup::kAttnPost));

  if (!moe) {
    ops.push_back(fp8_gemm("mlp gate+up", d, GemmKind::kDense, {t, 2.0 * m.dense_intermediate, h},
                           OpGroup::kRouted));
    ops.push_back(fp8_gemm("mlp down", d, GemmKind::kDense, {t, h, double(m.dense_intermediate)},
                           OpGroup::kRouted));
    return ops;
  }

  ops.push_back(bf16_gemm("router gate", d, {t, double(m.routed_experts), h}, OpGroup::kGate));
  if (m.shared_experts > 0) {
    double inter = double(m.shared_experts) * m.moe_intermediate;
    ops.push_back(
        fp8_gemm("shared gate+up", d, GemmKind::kDense, {t, 2.0 * inter, h}, OpGroup::kShared));
    ops.push_back(fp8_gemm("shared down", d, GemmKind::kDense, {t, h, inter}, OpGroup::kShared));
  }
  double per_expert = tokens_per_expert(m, e, t) * e.imbalance;
  double groups = experts_per_device(m, e);
  GemmKind kind = mb.decode ? GemmKind::kGroupedMasked : GemmKind::kGroupedContiguous;
  ops.push_back(fp8_gemm("routed gate+up", d, kind,
                         {per_expert, 2.0 * m.moe_intermediate, h, groups}, OpGroup::kRouted));
  ops.push_back(fp8_gemm("routed down", d, kind,
                         {per_expert, h, double(m.moe_intermediate), groups}, OpGroup::kRouted));

  double ep = e.ep;
  // The all-to-all finishes when the busiest receiver does.
  double db = dispatch_bytes(m, e, t) * e.imbalance;
  double cb = combine_bytes(m, e, t) * e.imbalance;
  if (ep > 1) {
    ops.push_back({"dispatch (all-to-all)", 0, db, db / dispatch_bw(n, e.comm, ep), true,
                   OpGroup::kDispatch});
    ops.push_back(
        {"combine (all-to-all)", 0, cb, cb / combine_bw(n, e.comm, ep), true, OpGroup::kCombine});
  }
  return ops;
}

OpCost lm_head_op(const ModelSpec& m, const DeviceSpec& d, double rows) {
  GemmShape s{rows, double(m.vocab), double(m.hidden)};
  return {"lm_head", gemm_flops(s),     gemm_bytes(s, 2, 2), bf16_gemm_seconds(d, s),
          false,     OpGroup::kAttnPost};
}

}  // namespace moeserve::sim
