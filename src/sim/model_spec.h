// ModelSpec: the architecture numbers the cost model needs from a DeepSeek-V3/R1-class model
// (MLA attention, dense-then-MoE FFN, MTP), and where they come from.
//
// Filled from a preset name ("deepseek-v3", "deepseek-v2-lite") or from a Hugging Face
// config.json; validated once at load (CONTRIBUTING.md rule 7), plain value afterwards. No weights
// are read: the simulator only counts FLOPs and bytes. Thread-compatible (immutable after load).
#pragma once

#include <string>

#include "core/status.h"

namespace moeserve::sim {

struct ModelSpec {
  std::string name;
  int hidden = 0;              // hidden_size
  int layers = 0;              // num_hidden_layers
  int first_dense_layers = 0;  // first_k_dense_replace
  int dense_intermediate = 0;  // intermediate_size (dense MLP layers)
  int moe_intermediate = 0;    // moe_intermediate_size (one expert)
  int routed_experts = 0;      // n_routed_experts
  int shared_experts = 0;      // n_shared_experts
  int experts_per_token = 0;   // num_experts_per_tok (top-k)
  int vocab = 0;               // vocab_size
  int heads = 0;               // num_attention_heads
  int q_lora_rank = 0;         // 0: no q compression (V2-Lite), q_proj straight from hidden
  int kv_lora_rank = 0;        // latent width cached per token
  int qk_nope_dim = 0;         // qk_nope_head_dim
  int qk_rope_dim = 0;         // qk_rope_head_dim (shared rope key, cached next to the latent)
  int v_head_dim = 0;
  int mtp_layers = 0;  // num_nextn_predict_layers

  int moe_layers() const { return layers - first_dense_layers; }
  int qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  // Values cached per token per layer: the latent plus the rope key (576 for V3).
  int kv_cache_width() const { return kv_lora_rank + qk_rope_dim; }
};

// "deepseek-v3" (also V3-0324, R1: same architecture) or "deepseek-v2-lite".
Result<ModelSpec> model_preset(const std::string& name);
// Parses the architecture fields of a Hugging Face config.json (text, not a path).
Result<ModelSpec> model_from_hf_config(const std::string& json_text, const std::string& name);
// A preset name, or a path to a config.json file.
Result<ModelSpec> load_model_spec(const std::string& preset_or_path);
Status validate(const ModelSpec& m);

}  // namespace moeserve::sim
