// make_engine: the concrete Engine (engine.h) over a DeepSeek checkpoint: one step thread
// running Scheduler + DeepseekModel over a paged latent cache with prefix caching.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "engine/engine.h"
#include "model/deepseek.h"

namespace moeserve {

struct EngineOptions {
  std::string model_dir;
  int threads = 0;               // compute threads (0: all cores)
  double kv_cache_gb = 1.0;      // memory for the latent KV cache
  int64_t max_num_seqs = 64;     // running sequences
  // Tokens per step. Running decodes wait for the whole step, so on CPUs (~100-1000 prefill
  // tokens/s) a small budget keeps inter-token latency bounded while prompts stream in.
  int64_t max_batch_tokens = 256;
  int64_t max_waiting = 1024;    // queued requests beyond which submit() refuses
  int64_t max_model_len = 0;     // 0: the model's max_position_embeddings
  DType kv_dtype = DType::kBF16;
  AttentionMode attention = AttentionMode::kAbsorbed;
  ComputePath compute = ComputePath::kFast;
  bool progress = false;         // loading progress on stderr
};

Result<std::unique_ptr<Engine>> make_engine(const EngineOptions& options);

}  // namespace moeserve
