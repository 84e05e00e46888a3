// make_model: writes a random-weight checkpoint in the official DeepSeek HF format (FP8 e4m3
// projections with F32 weight_scale_inv per 128x128 block; BF16 embeddings, lm_head, gate and
// norms; F32 e_score_correction_bias; config.json with quantization_config; an index and >= 2
// shards), deterministic for a given preset, overrides and seed. Used for the embedded default
// model, for tests and for benchmarks, since real weights cannot be downloaded everywhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/config.h"

namespace moeserve {

struct MakeModelOptions {
  std::string preset = "tiny";         // tiny | bench | v2-lite-tiny | v32-tiny
  std::vector<std::string> overrides;  // "key=value" on config.json fields (value is JSON)
  uint64_t seed = 0;
  int shards = 0;             // 0: automatic (>= 2)
  std::string tokenizer_dir;  // copied into the checkpoint when non-empty
};

std::vector<std::string> make_model_presets();

// The config a preset and overrides produce (validated).
Result<ModelConfig> make_model_config(const MakeModelOptions& options);

// Writes the checkpoint into out_dir (created if needed). Returns the bytes of tensor data.
Result<uint64_t> make_model(const MakeModelOptions& options, const std::string& out_dir,
                            ThreadPool* pool);

}  // namespace moeserve
