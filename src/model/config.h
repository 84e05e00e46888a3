// ModelConfig: a Hugging Face DeepSeek config.json (model_type deepseek_v3, deepseek_v2 or
// deepseek_v32),
// parsed and validated once at load. Every later stage trusts it.
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
enum class ScoringFunc { kSigmoid, kSoftmax };

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
  // FP8 e4m3 weights with F32 weight_scale_inv per block_n x block_k block.
  int64_t block_n = 128;
  int64_t block_k = 128;
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
