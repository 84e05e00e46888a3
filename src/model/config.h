// ModelConfig: a DeepSeek config.json (model_type deepseek_v3, deepseek_v2, deepseek_v32 or
// deepseek_v4), parsed and validated once at load. Every later stage trusts it.
//
// Variants are told apart only by these fields (topk_method, scoring_func, q_lora_rank, ...),
// never by sizes. A missing or inconsistent field is an error that names it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace moeserve {

enum class TopkMethod { kNoauxTc, kGroupLimitedGreedy, kGreedy };
// kSqrtSoftplus: sqrt(softplus(logit)) (DeepSeek-V4).
enum class ScoringFunc { kSigmoid, kSoftmax, kSqrtSoftplus };

struct YarnScaling {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

// DeepSeek Sparse Attention (DeepSeek-V3.2, model_type deepseek_v32; docs/dsa.md): the lightning
// indexer's heads and head width, and how many cached tokens each query attends to.
struct IndexerConfig {
  int64_t n_heads = 64;    // index_n_heads
  int64_t head_dim = 128;  // index_head_dim (its first qk_rope_head_dim dims carry RoPE)
  int64_t topk = 2048;     // index_topk
};

struct QuantConfig {
  // FP8 e4m3 weights with F32 weight_scale_inv per block_n x block_k block, or (ue8m0, DeepSeek-V4)
  // a power-of-two `<name>.scale` per block in F8_E8M0.
  int64_t block_n = 128;
  int64_t block_k = 128;
  bool ue8m0 = false;  // scale_fmt "ue8m0"
};

// DeepSeek-V4 (model_type deepseek_v4; docs/deepseek-v4.md): per-layer attention kinds over one
// shared KV head, multi-stream residuals (mHC), hash-routed first layers, FP4 routed experts.
// The shared fields (hidden size, heads, experts, q_lora_rank, qk_rope_head_dim, rope_theta and
// its YaRN rope_scaling, the indexer) are ModelConfig's; for V4, kv_lora_rank and
// qk_nope_head_dim are head_dim - qk_rope_head_dim and v_head_dim is head_dim (K = V).
struct V4Config {
  int64_t head_dim = 512;  // per query head and of the shared KV head
  int64_t o_groups = 8;    // grouped output projection
  int64_t o_lora_rank = 1024;
  int64_t sliding_window = 128;  // keys t - window + 1 .. t in every layer
  // Per layer, then the MTP layer's: 0 (sliding window only), 4 (compressed sparse attention:
  // 4-token entries, an indexer picks index_topk of them) or 128 (heavily compressed: all).
  std::vector<int64_t> compress_ratios;
  double compress_rope_theta = 160000.0;  // RoPE base of layers with a compressor (with YaRN)
  int64_t hc_mult = 4;                    // residual streams
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  int64_t num_hash_layers = 0;  // the first MoE layers route by a token-id table
  double swiglu_limit = 0.0;    // the experts' SwiGLU clamp (0: none)
  bool fp4_experts = false;     // expert_dtype "fp4": routed experts FP4 e2m1 with UE8M0 per 32

  int64_t ratio(int64_t layer) const { return compress_ratios[size_t(layer)]; }
};

struct ModelConfig {
  std::string model_type;  // "deepseek_v3" | "deepseek_v2" | "deepseek_v32"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // each routed expert; shared = this * n_shared_experts
  int64_t num_hidden_layers = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t num_attention_heads = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  TopkMethod topk_method = TopkMethod::kGreedy;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  std::optional<int64_t> q_lora_rank;  // nullopt: plain q_proj (V2-Lite)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double rope_theta = 10000.0;
  std::optional<YarnScaling> rope_scaling;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;
  std::optional<QuantConfig> quant;      // nullopt: BF16 (or F32/F16) checkpoint
  int64_t num_nextn_predict_layers = 0;  // MTP layers stored after the main layers
  std::optional<IndexerConfig> indexer;  // deepseek_v32: every layer's attention is sparse
                                         // (deepseek_v4: the compressed sparse layers')
  std::optional<V4Config> v4;            // deepseek_v4

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Latent KV values per token per layer: the compressed kv plus the shared rope key.
  int64_t kv_cache_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  bool is_moe_layer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  int64_t num_moe_layers() const {
    int64_t n = 0;
    for (int64_t l = 0; l < num_hidden_layers; ++l) n += is_moe_layer(l);
    return n;
  }
  // Softmax scale of attention, including the YaRN mscale (mscale_all_dim) correction.
  double softmax_scale() const;
};

// Parses the text of a config.json. `source` names the file in error messages.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
Result<ModelConfig> load_model_config(const std::string& path);

// The config as HF config.json text (used by make-model).
std::string model_config_to_json(const ModelConfig& config);

}  // namespace moeserve
