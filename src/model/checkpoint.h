// Checkpoint: a Hugging Face DeepSeek checkpoint directory (config.json plus one
// model.safetensors or shards listed in model.safetensors.index.json), mapped lazily and
// turned into typed, shape-checked weight views.
//
// Owns the SafetensorsFiles; every WeightView in `weights()` points into their mappings and is
// valid for the Checkpoint's life. Nothing is copied except norm vectors and gate biases
// (small, converted to float). FP8 projections stay FP8 with their weight_scale_inv blocks.
// Routed experts that the dispatcher says live on another rank are not mapped (EP), and MTP
// layers (index >= num_hidden_layers) are skipped unless LoadOptions::mtp asks for the first. Every
// tensor of the files must be consumed or skipped by name: leftovers are reported as unexpected.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/weight_view.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace moeserve {

struct MlpWeights {  // SiLU(x W_gate^T) * (x W_up^T) W_down^T
  WeightView gate, up, down;
};

// DeepSeek Sparse Attention's lightning indexer (V3.2; docs/dsa.md): i heads of d dims.
struct IndexerWeights {
  WeightView wq_b;            // [i * d, q_lora_rank] (FP8 in the official checkpoints)
  WeightView wk;              // [d, hidden] (FP8)
  std::vector<float> k_norm;  // [d] LayerNorm weight
  std::vector<float> k_bias;  // [d] LayerNorm bias
  WeightView weights_proj;    // [i, hidden] (BF16)
};

struct AttentionWeights {
  std::optional<WeightView> q_a;  // [q_lora_rank, hidden] when q_lora_rank is set
  std::vector<float> q_a_norm;    // [q_lora_rank]
  WeightView q_b;                 // [heads * qk_head_dim, q_lora_rank or hidden] (q_b or q_proj)
  WeightView kv_a;                // [kv_lora_rank + rope_dim, hidden]
  std::vector<float> kv_a_norm;   // [kv_lora_rank]
  WeightView kv_b;                // [heads * (nope + v), kv_lora_rank]
  WeightView o;                   // [hidden, heads * v_head_dim]
  std::optional<IndexerWeights> indexer;  // config.indexer (V3.2)
};

struct MoeWeights {
  WeightView gate;                                 // [n_routed_experts, hidden]
  std::vector<float> score_bias;                   // [n_routed_experts] (noaux_tc) or empty
  std::vector<std::optional<MlpWeights>> experts;  // [n_routed_experts]; nullopt: not on this rank
  std::optional<MlpWeights> shared;  // intermediate = moe_intermediate * n_shared_experts
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;  // [hidden]
  AttentionWeights attn;
  std::optional<MlpWeights> mlp;  // dense layers
  std::optional<MoeWeights> moe;  // MoE layers
};

// The first MTP module (docs/mtp.md) but for its decoder layer, which is
// ModelWeights::layers[num_hidden_layers]. Row p: x = eh_proj [enorm(embed(t_{p+1})); hnorm(H_p)]
// (the embedding first), the decoder layer, head_norm, then the main model's lm_head.
struct MtpWeights {
  std::vector<float> enorm, hnorm;  // [hidden]
  WeightView eh_proj;               // [hidden, 2 * hidden]
  std::vector<float> head_norm;     // [hidden] shared_head.norm
};

struct V4Weights;

struct ModelWeights {
  WeightView embed;  // [vocab, hidden]
  // The num_hidden_layers main layers, then the MTP module's decoder layer when it is loaded.
  std::vector<LayerWeights> layers;
  std::vector<float> norm;        // [hidden]
  WeightView lm_head;             // [vocab, hidden] (the embedding when tied)
  std::optional<MtpWeights> mtp;  // LoadOptions::mtp
  // DeepSeek-V4 (model/deepseek_v4_weights.h): its own names and structure; the fields above
  // stay empty.
  std::shared_ptr<const V4Weights> v4;
};

struct LoadOptions {
  // Which routed experts to map; default all (single process).
  std::function<bool(int32_t expert)> holds_expert;
  // Per MoE layer (moe_layer counts MoE layers only, 0 = the first), for placements that differ
  // per layer (EPLB); when set it decides instead of holds_expert.
  std::function<bool(int64_t moe_layer, int32_t expert)> holds_layer_expert;
  bool progress = false;  // a progress line on stderr
  // Also load the first MTP module (model.layers.<num_hidden_layers>.*) for speculative decoding;
  // otherwise MTP tensors are skipped. Its MoE layer counts as the last MoE layer (moe_layer =
  // num_moe_layers()) for holds_layer_expert.
  bool mtp = false;
};

class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir,
                                                  const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const std::string& dir() const { return dir_; }
  // Bytes of tensor data mapped for this rank's weights.
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  Checkpoint() = default;

  std::string dir_;
  ModelConfig config_;
  std::vector<SafetensorsFile> files_;
  std::deque<std::vector<float>> aligned_copies_;  // scales a writer left misaligned
  ModelWeights weights_;
  size_t weight_bytes_ = 0;
};

}  // namespace moeserve
