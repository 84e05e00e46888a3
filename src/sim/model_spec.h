// ModelSpec: the architecture numbers the cost model needs from a DeepSeek model, and where they
// come from: V2/V3/R1 (MLA attention, dense-then-MoE FFN, MTP) or V4 (one shared 512-wide KV
// head over a 128-token window plus compressed entries, CSA layers with a lightning indexer, HCA
// layers, grouped output projection, mHC residual streams, all-MoE FFN with FP4 routed experts).
//
// Filled from a preset name ("deepseek-v3", "deepseek-v2-lite", "deepseek-v4-flash",
// "deepseek-v4-pro") or from a Hugging Face config.json; validated once at load (CONTRIBUTING.md
// rule 7), plain value afterwards. No weights are read: the simulator only counts FLOPs and bytes.
// Thread-compatible (immutable after load).
#pragma once

#include <string>

#include "core/status.h"

namespace moeserve::sim {

enum class AttentionKind {
  kMla,  // DeepSeek-V2/V3/R1: multi-head latent attention over a compressed latent cache
  kV4,   // DeepSeek-V4: sliding window + compressed (CSA/HCA) entries, one shared KV head
};

struct ModelSpec {
  std::string name;
  AttentionKind attention = AttentionKind::kMla;
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
  // Bytes per routed-expert weight: FP8 = 1; V4's FP4 (e2m1) = 0.5 plus one UE8M0 scale byte
  // per 32 weights = 0.53125.
  double routed_weight_bytes = 1.0;

  // --- DeepSeek-V4 only (attention == kV4); q_lora_rank above is V4's too. ---
  int head_dim = 0;        // head_dim: q, k = v per head (512); one shared KV head
  int kv_heads = 0;        // num_key_value_heads (1)
  int o_groups = 0;        // grouped output projection: groups of heads
  int o_lora_rank = 0;     // rows of wo_a per group
  int sliding_window = 0;  // keys t-win+1..t every layer attends to (128)
  int sliding_layers = 0;  // main layers of compress ratio 0 (window only)
  int csa_layers = 0;      // ratio csa_ratio (4): overlapping compressor + indexer top-k
  int hca_layers = 0;      // ratio hca_ratio (128): every compressed entry
  int csa_ratio = 4;
  int hca_ratio = 128;
  int mtp_compress_ratio = 0;  // compress_ratios[num_hidden_layers]: the MTP layer's (0)
  int index_heads = 0;         // index_n_heads
  int index_head_dim = 0;      // index_head_dim
  int index_topk = 0;          // compressed entries a CSA query keeps
  int hc_mult = 1;             // mHC residual streams (4); 1: a plain residual
  int hash_layers = 0;         // num_hash_layers: experts from tid2eid (the gate still scores)

  bool v4() const { return attention == AttentionKind::kV4; }
  // V4's cache formats as DeepSeek's inference code quantizes them (model.py's FP8/FP4
  // simulation marks what its kernels store): a window or compressed entry is the non-RoPE
  // head_dim - rope values in e4m3 with one UE8M0 scale per 64, plus the RoPE values in BF16
  // (448 + 7 + 128 = 583 bytes); an index key is index_head_dim FP4 values with one UE8M0 scale
  // per 32 (64 + 4 = 68 bytes).
  double v4_entry_bytes() const {
    double nope = head_dim - qk_rope_dim;
    return nope + nope / 64 + 2.0 * qk_rope_dim;
  }
  double v4_index_key_bytes() const { return index_head_dim / 2.0 + index_head_dim / 32.0; }
  int moe_layers() const { return layers - first_dense_layers; }
  int qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  // Values cached per token per layer: the latent plus the rope key (576 for V3).
  int kv_cache_width() const { return kv_lora_rank + qk_rope_dim; }
};

// "deepseek-v3" (also V3-0324, R1: same architecture), "deepseek-v2-lite", "deepseek-v4-flash" or
// "deepseek-v4-pro" (the hub config.json of each; docs/sim.md lists the V4 values).
Result<ModelSpec> model_preset(const std::string& name);
// Parses the architecture fields of a Hugging Face config.json (text, not a path); model_type
// "deepseek_v4" reads V4's keys (head_dim, o_groups, compress_ratios, index_*, hc_mult, ...).
Result<ModelSpec> model_from_hf_config(const std::string& json_text, const std::string& name);
// A preset name, or a path to a config.json file.
Result<ModelSpec> load_model_spec(const std::string& preset_or_path);
Status validate(const ModelSpec& m);

}  // namespace moeserve::sim
