#include "model/deepseek_v4_weights.h"

#include <fmt/format.h>

#include "model/checkpoint_binder.h"

namespace moeserve {

namespace {

Result<V4HcWeights> bind_hc(CheckpointBinder& b, const std::string& stem, int64_t mixes,
                            int64_t scales, int64_t width) {
  V4HcWeights h;
  ASSIGN_OR_RETURN(h.fn, b.matrix(stem + "_fn", mixes, width));
  if (h.fn.dtype != DType::kF32) {
    return InvalidArgument(
        fmt::format("{}: tensor '{}_fn' must be F32", b.file_of(stem + "_fn"), stem));
  }
  ASSIGN_OR_RETURN(h.base, b.vector(stem + "_base", mixes));
  ASSIGN_OR_RETURN(h.scale, b.vector(stem + "_scale", scales));
  return h;
}

Result<V4CompressorWeights> bind_compressor(CheckpointBinder& b, const std::string& p, int64_t d,
                                            int64_t ratio, int64_t hidden) {
  const int64_t c = ratio == 4 ? 2 : 1;  // overlapping entries keep two halves per token
  V4CompressorWeights w;
  ASSIGN_OR_RETURN(w.wkv, b.matrix(p + "wkv.weight", c * d, hidden));
  ASSIGN_OR_RETURN(w.wgate, b.matrix(p + "wgate.weight", c * d, hidden));
  ASSIGN_OR_RETURN(w.ape, b.floats(p + "ape", {ratio, c * d}));
  ASSIGN_OR_RETURN(w.norm, b.vector(p + "norm.weight", d));
  return w;
}

Result<MlpWeights> bind_expert(CheckpointBinder& b, const std::string& p, int64_t hidden,
                               int64_t inter, bool fp4) {
  auto m = [&](const std::string& name, int64_t rows, int64_t cols) {
    return fp4 ? b.fp4_matrix(name, rows, cols) : b.matrix(name, rows, cols);
  };
  MlpWeights e;
  ASSIGN_OR_RETURN(e.gate, m(p + "w1.weight", inter, hidden));
  ASSIGN_OR_RETURN(e.up, m(p + "w3.weight", inter, hidden));
  ASSIGN_OR_RETURN(e.down, m(p + "w2.weight", hidden, inter));
  return e;
}

Status bind_layer(CheckpointBinder& b, const ModelConfig& c, const std::string& p, int64_t layer,
                  int64_t moe_layer, const LoadOptions& options, V4LayerWeights* out) {
  const V4Config& v = *c.v4;
  const int64_t D = c.hidden_size, H = c.num_attention_heads, hc = v.hc_mult;
  const int64_t qr = *c.q_lora_rank, Dh = v.head_dim;
  const int64_t ratio = v.ratio(layer);
  const bool hash = layer < v.num_hash_layers;
  V4LayerWeights& L = *out;
  ASSIGN_OR_RETURN(L.attn_norm, b.vector(p + "attn_norm.weight", D));
  ASSIGN_OR_RETURN(L.ffn_norm, b.vector(p + "ffn_norm.weight", D));
  ASSIGN_OR_RETURN(L.hc_attn, bind_hc(b, p + "hc_attn", (2 + hc) * hc, 3, hc * D));
  ASSIGN_OR_RETURN(L.hc_ffn, bind_hc(b, p + "hc_ffn", (2 + hc) * hc, 3, hc * D));
  const std::string a = p + "attn.";
  ASSIGN_OR_RETURN(L.attn_sink, b.vector(a + "attn_sink", H));
  ASSIGN_OR_RETURN(L.wq_a, b.matrix(a + "wq_a.weight", qr, D));
  ASSIGN_OR_RETURN(L.q_norm, b.vector(a + "q_norm.weight", qr));
  ASSIGN_OR_RETURN(L.wq_b, b.matrix(a + "wq_b.weight", H * Dh, qr));
  ASSIGN_OR_RETURN(L.wkv, b.matrix(a + "wkv.weight", Dh, D));
  ASSIGN_OR_RETURN(L.kv_norm, b.vector(a + "kv_norm.weight", Dh));
  ASSIGN_OR_RETURN(L.wo_a,
                   b.matrix(a + "wo_a.weight", v.o_groups * v.o_lora_rank, H * Dh / v.o_groups));
  ASSIGN_OR_RETURN(L.wo_b, b.matrix(a + "wo_b.weight", D, v.o_groups * v.o_lora_rank));
  if (ratio != 0) {
    ASSIGN_OR_RETURN(L.compressor, bind_compressor(b, a + "compressor.", Dh, ratio, D));
  }
  if (ratio == 4) {
    const IndexerConfig& ix = *c.indexer;
    V4IndexerWeights& I = L.indexer.emplace();
    ASSIGN_OR_RETURN(I.wq_b, b.matrix(a + "indexer.wq_b.weight", ix.n_heads * ix.head_dim, qr));
    ASSIGN_OR_RETURN(I.weights_proj, b.matrix(a + "indexer.weights_proj.weight", ix.n_heads, D));
    ASSIGN_OR_RETURN(I.compressor,
                     bind_compressor(b, a + "indexer.compressor.", ix.head_dim, 4, D));
  }
  const std::string f = p + "ffn.";
  ASSIGN_OR_RETURN(L.gate, b.matrix(f + "gate.weight", c.n_routed_experts, D));
  if (hash) {
    ASSIGN_OR_RETURN(L.tid2eid, b.ids(f + "gate.tid2eid", {c.vocab_size, c.num_experts_per_tok},
                                      c.n_routed_experts));
  } else {
    ASSIGN_OR_RETURN(L.gate_bias, b.vector(f + "gate.bias", c.n_routed_experts));
  }
  L.experts.resize(size_t(c.n_routed_experts));
  for (int32_t e = 0; e < int32_t(c.n_routed_experts); ++e) {
    const std::string ep = fmt::format("{}experts.{}.", f, e);
    const bool held = options.holds_layer_expert ? options.holds_layer_expert(moe_layer, e)
                      : options.holds_expert     ? options.holds_expert(e)
                                                 : true;
    if (!held) {
      b.skip_prefix(ep);
      continue;
    }
    ASSIGN_OR_RETURN(L.experts[size_t(e)],
                     bind_expert(b, ep, D, c.moe_intermediate_size, v.fp4_experts));
  }
  ASSIGN_OR_RETURN(L.shared, bind_expert(b, f + "shared_experts.", D, c.moe_intermediate_size,
                                         /*fp4=*/false));
  return Status::Ok();
}

}  // namespace

Status bind_v4_weights(CheckpointBinder& b, const ModelConfig& c, const LoadOptions& options,
                       V4Weights* out) {
  const V4Config& v = *c.v4;
  const int64_t D = c.hidden_size, hc = v.hc_mult;
  V4Weights& w = *out;
  ASSIGN_OR_RETURN(w.embed, b.matrix("embed.weight", c.vocab_size, D));
  ASSIGN_OR_RETURN(w.head, b.matrix("head.weight", c.vocab_size, D));
  ASSIGN_OR_RETURN(w.norm, b.vector("norm.weight", D));
  ASSIGN_OR_RETURN(w.hc_head, bind_hc(b, "hc_head", hc, 1, hc * D));
  const int64_t n_layers = c.num_hidden_layers + (options.mtp ? 1 : 0);
  w.layers.resize(size_t(n_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    RETURN_IF_ERROR(
        bind_layer(b, c, fmt::format("layers.{}.", l), l, l, options, &w.layers[size_t(l)]));
  }
  if (!options.mtp) {
    b.skip_prefix("mtp.");
    return Status::Ok();
  }
  const std::string p = "mtp.0.";
  RETURN_IF_ERROR(
      bind_layer(b, c, p, c.num_hidden_layers, c.num_hidden_layers, options, &w.layers.back()));
  V4MtpWeights& m = w.mtp.emplace();
  ASSIGN_OR_RETURN(m.e_proj, b.matrix(p + "e_proj.weight", D, D));
  ASSIGN_OR_RETURN(m.h_proj, b.matrix(p + "h_proj.weight", D, D));
  ASSIGN_OR_RETURN(m.enorm, b.vector(p + "enorm.weight", D));
  ASSIGN_OR_RETURN(m.hnorm, b.vector(p + "hnorm.weight", D));
  ASSIGN_OR_RETURN(m.norm, b.vector(p + "norm.weight", D));
  ASSIGN_OR_RETURN(m.hc_head, bind_hc(b, p + "hc_head", hc, 1, hc * D));
  // Copies of the main model's embedding and head, where a release carries them (DeepSeek's
  // convert.py drops them: the module shares the main model's).
  b.skip_prefix(p + "emb");
  b.skip_prefix(p + "head.");
  return Status::Ok();
}

}  // namespace moeserve
