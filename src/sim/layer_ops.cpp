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

// A GEMM whose weights are stored in `weight_bytes` per element and computed at FP8 (FP4
// routed experts: Hopper has no FP4 math, the kernel widens them) or, without FP8 math, BF16.
// Shapes of V4 are not in DeepGEMM's published tables: roofline at the fallback fractions.
OpCost packed_gemm(const char* name, const DeviceSpec& d, GemmShape s, double weight_bytes,
                   OpGroup g) {
  const bool fp8 = d.fp8_flops > 0;
  const double act = fp8 ? 1 : 2;
  return {name,
          gemm_flops(s),
          gemm_bytes(s, weight_bytes, act),
          roofline_gemm_seconds(d, s, weight_bytes, act, fp8 ? d.fp8_flops : d.bf16_flops),
          false,
          g};
}

// Router gate, shared expert(s), routed experts and the all-to-all around them.
void moe_ops(const ModelSpec& m, const DeviceSpec& d, const NodeSpec& n, const ExpertLayout& e,
             const MicroBatch& mb, std::vector<OpCost>* ops) {
  const double t = mb.tokens;
  const double h = m.hidden;
  ops->push_back(bf16_gemm("router gate", d, {t, double(m.routed_experts), h}, OpGroup::kGate));
  if (m.shared_experts > 0) {
    double inter = double(m.shared_experts) * m.moe_intermediate;
    ops->push_back(
        fp8_gemm("shared gate+up", d, GemmKind::kDense, {t, 2.0 * inter, h}, OpGroup::kShared));
    ops->push_back(fp8_gemm("shared down", d, GemmKind::kDense, {t, h, inter}, OpGroup::kShared));
  }
  double per_expert = tokens_per_expert(m, e, t) * e.imbalance;
  double groups = experts_per_device(m, e);
  GemmKind kind = mb.decode ? GemmKind::kGroupedMasked : GemmKind::kGroupedContiguous;
  GemmShape up{per_expert, 2.0 * m.moe_intermediate, h, groups};
  GemmShape down{per_expert, h, double(m.moe_intermediate), groups};
  if (m.routed_weight_bytes == 1.0) {
    ops->push_back(fp8_gemm("routed gate+up", d, kind, up, OpGroup::kRouted));
    ops->push_back(fp8_gemm("routed down", d, kind, down, OpGroup::kRouted));
  } else {
    ops->push_back(packed_gemm("routed gate+up", d, up, m.routed_weight_bytes, OpGroup::kRouted));
    ops->push_back(packed_gemm("routed down", d, down, m.routed_weight_bytes, OpGroup::kRouted));
  }

  double ep = e.ep;
  // The all-to-all finishes when the busiest receiver does.
  double db = dispatch_bytes(m, e, t) * e.imbalance;
  double cb = combine_bytes(m, e, t) * e.imbalance;
  if (ep > 1) {
    ops->push_back({"dispatch (all-to-all)", 0, db, db / dispatch_bw(n, e.comm, ep), true,
                    OpGroup::kDispatch});
    ops->push_back(
        {"combine (all-to-all)", 0, cb, cb / combine_bw(n, e.comm, ep), true, OpGroup::kCombine});
  }
}

// Compressor output width multiple: the overlapping CSA compressor produces two halves.
int compressor_mult(const ModelSpec& m, int ratio) {
  return ratio == m.csa_ratio ? 2 : 1;
}

// mHC per token per sublayer (attention, FFN): the mixes [(2 + hc) hc] from the hc·D streams,
// the pre-weighted sum (2 hc D) and the post update (2 hc D + 2 hc^2 D). Sinkhorn on the hc x hc
// matrix (20 iterations, ~1.3 kFLOP for hc = 4) is left out.
double mhc_mix_width(const ModelSpec& m) {
  return double(2 + m.hc_mult) * m.hc_mult;
}

// One DeepSeek-V4 layer (docs/sim.md "DeepSeek-V4").
std::vector<OpCost> v4_layer_ops(const ModelSpec& m, const DeviceSpec& d, const NodeSpec& n,
                                 const ExpertLayout& e, const MicroBatch& mb, int ratio) {
  std::vector<OpCost> ops;
  const double t = mb.tokens;
  const double h = m.hidden;
  const double heads = m.heads;
  const double dh = m.head_dim;
  const double qr = m.q_lora_rank;
  const double hc = m.hc_mult;
  const bool csa = ratio == m.csa_ratio;
  const bool hca = ratio == m.hca_ratio;
  if (t <= 0) return ops;

  // Per sublayer: hc_pre reads the hc streams and writes x, RMSNorm (r + w), FP8 quantization
  // (r), hc_post reads f and the streams and writes the streams: (3 hc + 5) passes of T·D BF16;
  // two sublayers. Plus q_norm (r + w of q_lora, and the FP8 quantization before wq_b: r),
  // kv_norm (r + w of head_dim) and the per-head q RMSNorm with RoPE (r + w of H·head_dim).
  double ew = ((6 * hc + 10) * h + 3 * qr + 2 * dh + 2 * heads * dh) * t * 2.0;
  ops.push_back({"elementwise", 0, ew, memory_seconds(d, ew), false, OpGroup::kAttnPre});
  {
    // The mixes GEMM of both sublayers (F32 weights, TF32 at half the BF16 rate) plus the
    // weighted sums.
    GemmShape mix{t, mhc_mix_width(m), hc * h, 2};
    double flops = gemm_flops(mix) + 2 * t * (4 * hc + 2 * hc * hc) * h;
    double bytes = 2 * mhc_mix_width(m) * hc * h * 4.0;
    double secs =
        std::max(flops / (d.bf16_flops / 2 * d.gemm_compute_eff), memory_seconds(d, bytes));
    ops.push_back({"mHC pre/post", flops, bytes, secs, false, OpGroup::kAttnPre});
  }

  // Query latent and the shared KV head read the same input: one GEMM (as V3's q_a+kv_a).
  ops.push_back(fp8_gemm("wq_a+wkv", d, GemmKind::kDense, {t, qr + dh, h}, OpGroup::kAttnPre));
  if (ratio != 0) {
    // The compressor's wkv and wgate (BF16), c·head_dim each, c = 2 for the overlapping CSA.
    double c = compressor_mult(m, ratio);
    ops.push_back(bf16_gemm("compressor wkv+wgate", d, {t, 2 * c * dh, h}, OpGroup::kAttnPre));
    // Pooling: each token's kv and score (F32) written to the compressor state and read back
    // when its group completes.
    double pool = t * 2 * (2 * c * dh) * 4.0;
    if (csa) pool += t * 2 * (2 * 2.0 * m.index_head_dim) * 4.0;
    ops.push_back({"compressor pooling", t * 5 * c * dh, pool, memory_seconds(d, pool), false,
                   OpGroup::kAttnPre});
  }
  if (csa) {
    const double ih = m.index_heads, id = m.index_head_dim;
    ops.push_back(bf16_gemm("indexer weights_proj", d, {t, ih, h}, OpGroup::kAttnPre));
    ops.push_back(
        bf16_gemm("indexer compressor wkv+wgate", d, {t, 2 * 2 * id, h}, OpGroup::kAttnPre));
    ops.push_back(
        fp8_gemm("indexer wq_b", d, GemmKind::kDense, {t, ih * id, qr}, OpGroup::kAttnPre));
  }
  ops.push_back(fp8_gemm("wq_b", d, GemmKind::kDense, {t, heads * dh, qr}, OpGroup::kAttnPre));

  if (csa) {
    // Lightning indexer: every query token scores the complete entries before it, IH heads of
    // index_head_dim each (FP8 math), plus its IH weights per entry.
    const double ih = m.index_heads, id = m.index_head_dim;
    double flops = 2.0 * mb.v4_pairs.index * ih * (id + 1);
    double bytes = mb.decode ? mb.v4_reads.index * m.v4_index_key_bytes() : 0;
    double peak = d.fp8_flops > 0 ? d.fp8_flops : d.bf16_flops;
    double secs = std::max(flops / (peak * d.gemm_compute_eff), memory_seconds(d, bytes));
    ops.push_back({"indexer scores", flops, bytes, secs, false, OpGroup::kAttnCore});
  }
  {
    // Core attention over the window and the compressed entries: one KV head, K = V, QK and PV
    // both head_dim wide.
    double pairs = mb.v4_pairs.window + (hca ? mb.v4_pairs.hca : 0) + (csa ? mb.v4_pairs.csa : 0);
    double flops = 2.0 * pairs * heads * (dh + dh);
    if (mb.decode) {
      double entries =
          mb.v4_reads.window + (hca ? mb.v4_reads.hca : 0) + (csa ? mb.v4_reads.csa : 0);
      double bytes = entries * m.v4_entry_bytes() + t * heads * (dh + dh) * 2.0;
      double bw = d.attn_decode_bw > 0 ? d.attn_decode_bw : d.mem_bw * d.mem_bw_eff;
      double fl = d.attn_decode_flops > 0 ? d.attn_decode_flops : d.bf16_flops * d.gemm_compute_eff;
      ops.push_back({"core_attention (V4 decode)", flops, bytes, std::max(bytes / bw, flops / fl),
                     false, OpGroup::kAttnCore});
    } else {
      double fl =
          d.attn_prefill_flops > 0 ? d.attn_prefill_flops : d.bf16_flops * d.gemm_compute_eff;
      ops.push_back(
          {"core_attention (V4 prefill)", flops, 0, flops / fl, false, OpGroup::kAttnCore});
    }
  }
  // Grouped output projection: wo_a in BF16 (DeepSeek's convert.py dequantizes it), G groups of
  // [T, o_lora_rank, H·head_dim / G], then wo_b [T, D, G·o_lora_rank] in FP8.
  const double g = m.o_groups, r = m.o_lora_rank;
  ops.push_back(bf16_gemm("wo_a (grouped)", d, {t, r, heads * dh / g, g}, OpGroup::kAttnPost));
  ops.push_back(fp8_gemm("wo_b", d, GemmKind::kDense, {t, h, g * r}, OpGroup::kAttnPost));

  moe_ops(m, d, n, e, mb, &ops);
  return ops;
}

}  // namespace

V4Counts v4_counts(const ModelSpec& m, double positions) {
  V4Counts c;
  if (positions <= 0) return c;
  c.window = std::min<double>(m.sliding_window, positions);
  c.hca = m.hca_ratio > 0 ? std::floor(positions / m.hca_ratio) : 0;
  c.index = m.csa_ratio > 0 ? std::floor(positions / m.csa_ratio) : 0;
  c.csa = std::min<double>(m.index_topk, c.index);
  return c;
}

V4Counts v4_counts_causal(const ModelSpec& m, double cached, double fresh) {
  V4Counts sum;
  const double first = std::floor(cached) + 1, last = std::floor(cached + fresh);
  for (double p = first; p <= last; ++p) sum = sum + v4_counts(m, p);
  return sum;
}

V4Counts operator*(const V4Counts& c, double k) {
  return {c.window * k, c.hca * k, c.csa * k, c.index * k};
}

V4Counts operator+(const V4Counts& a, const V4Counts& b) {
  return {a.window + b.window, a.hca + b.hca, a.csa + b.csa, a.index + b.index};
}

double v4_layer_resident_bytes(const ModelSpec& m, int ratio) {
  const double h = m.hidden, dh = m.head_dim, qr = m.q_lora_rank, heads = m.heads;
  const double hc = m.hc_mult;
  double fp8 = h * qr + qr * heads * dh + h * dh + h * double(m.o_groups) * m.o_lora_rank +
               3.0 * h * m.moe_intermediate * m.shared_experts;
  double bf16 = double(m.o_lora_rank) * heads * dh + double(m.routed_experts) * h;
  if (ratio != 0) bf16 += 2.0 * compressor_mult(m, ratio) * dh * h;
  if (ratio == m.csa_ratio) {
    fp8 += double(m.index_heads) * m.index_head_dim * qr;
    bf16 += double(m.index_heads) * h + 4.0 * m.index_head_dim * h;
  }
  double f32 = 2 * mhc_mix_width(m) * hc * h;
  return fp8 + 2 * bf16 + 4 * f32;
}

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
                              const ExpertLayout& e, const MicroBatch& mb, bool moe,
                              int compress_ratio) {
  if (m.v4()) return v4_layer_ops(m, d, n, e, mb, compress_ratio);
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

  moe_ops(m, d, n, e, mb, &ops);
  return ops;
}

OpCost lm_head_op(const ModelSpec& m, const DeviceSpec& d, double rows) {
  GemmShape s{rows, double(m.vocab), double(m.hidden)};
  OpCost op{"lm_head", gemm_flops(s),     gemm_bytes(s, 2, 2), bf16_gemm_seconds(d, s),
            false,     OpGroup::kAttnPost};
  if (m.hc_mult > 1) {
    // hc_head: mixes [hc] from the hc·D streams and the weighted sum, F32 weights.
    const double hc = m.hc_mult, h = m.hidden;
    double flops = 2 * rows * hc * hc * h + 2 * rows * hc * h;
    op.flops += flops;
    op.seconds += std::max(flops / (d.bf16_flops / 2 * d.gemm_compute_eff),
                           memory_seconds(d, rows * hc * h * 2.0 + hc * hc * h * 4.0));
  }
  return op;
}

}  // namespace moeserve::sim
