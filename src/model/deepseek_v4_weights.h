// DeepSeek-V4's weights (docs/deepseek-v4.md), bound from the tensor names DeepSeek publishes
// (`embed.weight`, `layers.N.attn.wq_a.weight`, `layers.N.ffn.experts.E.w1.weight`, `mtp.0.*`,
// ...): FP8 projections with UE8M0 block scales, FP4 routed experts, BF16 and F32 small tensors.
// Views point into the checkpoint's mappings (or its converted scale copies): valid while the
// Checkpoint lives.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/weight_view.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace moeserve {

class CheckpointBinder;

// One mHC mixing site (before attention, before the MoE, or the final collapse): per token,
// mixes = fn . flatten(h) * rsqrt(mean(h^2) + eps), then scale and base per part.
struct V4HcWeights {
  WeightView fn;             // [(2 + hc) * hc, hc * hidden] (the final collapse: [hc, hc * hidden])
  std::vector<float> base;   // [(2 + hc) * hc] (final: [hc])
  std::vector<float> scale;  // [3] (final: [1])
};

// A compressor: per token kv = x wkv^T and gate = x wgate^T ([c * d], c = 2 with overlap), an
// entry per `ratio` tokens pooled by a per-channel softmax over the gates plus ape.
struct V4CompressorWeights {
  WeightView wkv, wgate;    // [c * d, hidden]
  std::vector<float> ape;   // [ratio, c * d]
  std::vector<float> norm;  // [d]
};

struct V4IndexerWeights {          // compressed sparse attention's lightning indexer
  WeightView wq_b;                 // [index_n_heads * index_head_dim, q_lora_rank]
  WeightView weights_proj;         // [index_n_heads, hidden]
  V4CompressorWeights compressor;  // d = index_head_dim, ratio 4, overlapping
};

struct V4LayerWeights {
  std::vector<float> attn_norm, ffn_norm;  // [hidden]
  V4HcWeights hc_attn, hc_ffn;
  // Attention.
  std::vector<float> attn_sink;  // [heads]
  WeightView wq_a;               // [q_lora_rank, hidden]
  std::vector<float> q_norm;     // [q_lora_rank]
  WeightView wq_b;               // [heads * head_dim, q_lora_rank]
  WeightView wkv;                // [head_dim, hidden]
  std::vector<float> kv_norm;    // [head_dim]
  WeightView wo_a;               // [o_groups * o_lora_rank, heads * head_dim / o_groups]
  WeightView wo_b;               // [hidden, o_groups * o_lora_rank]
  std::optional<V4CompressorWeights> compressor;  // ratio 4 or 128
  std::optional<V4IndexerWeights> indexer;        // ratio 4
  // MoE.
  WeightView gate;                                 // [n_routed_experts, hidden]
  std::vector<float> gate_bias;                    // [n_routed_experts] (top-k layers)
  std::vector<int32_t> tid2eid;                    // [vocab, experts_per_tok] (hash layers)
  std::vector<std::optional<MlpWeights>> experts;  // w1 = gate, w3 = up, w2 = down
  MlpWeights shared;
};

struct V4MtpWeights {         // the MTP module but for its block (V4Weights::layers' last)
  WeightView e_proj, h_proj;  // [hidden, hidden]
  std::vector<float> enorm, hnorm, norm;  // [hidden]
  V4HcWeights hc_head;
};

struct V4Weights {
  WeightView embed;         // [vocab, hidden]
  WeightView head;          // [vocab, hidden]
  std::vector<float> norm;  // [hidden]
  V4HcWeights hc_head;
  std::vector<V4LayerWeights> layers;  // the main layers, then the MTP block when loaded
  std::optional<V4MtpWeights> mtp;
};

// Binds every V4 tensor of the checkpoint (the MTP module's when options.mtp, else skipped).
Status bind_v4_weights(CheckpointBinder& b, const ModelConfig& config, const LoadOptions& options,
                       V4Weights* out);

}  // namespace moeserve
