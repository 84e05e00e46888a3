// Generator: runs a fixed set of requests to completion as one batch (prefill of all prompts,
// then one decode step per token for every unfinished sequence). The offline path of
// `moeserve generate` and of tests; the server's continuous-batching scheduler builds on the
// same DeepseekModel::forward and cache.
//
// Borrows the model, cache and allocator; blocks it allocates are freed before it returns.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cache/block_allocator.h"
#include "cache/latent_cache.h"
#include "engine/engine.h"
#include "kernels/sampling.h"
#include "model/deepseek.h"

namespace moeserve {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;  // greedy by default
  uint64_t seed = 0;
  int64_t top_logprobs = 0;  // how many (id, logprob) pairs to record per step
  bool ignore_eos = false;
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // one list per generated token
  FinishReason finish = FinishReason::kLength;
};

class Generator {
 public:
  Generator(DeepseekModel& model, LatentKvCache& cache, BlockAllocator& blocks)
      : model_(model), cache_(cache), blocks_(blocks) {}

  // Prompts longer than `prefill_chunk` tokens are prefilled in several steps (0: one step).
  Result<std::vector<GenerateResult>> generate(const std::vector<GenerateRequest>& requests,
                                               int64_t prefill_chunk = 0);
  // Called after every step (e.g. ExpertBalancer::end_step on every rank of an EP group); an
  // error ends generate() with it.
  void set_after_step(std::function<Status()> f) { after_step_ = std::move(f); }

 private:
  DeepseekModel& model_;
  LatentKvCache& cache_;
  BlockAllocator& blocks_;
  std::function<Status()> after_step_;
};

// Blocks needed to hold n tokens.
inline int32_t blocks_for(int64_t n_tokens) {
  return int32_t((n_tokens + kKvBlockSize - 1) / kKvBlockSize);
}

}  // namespace moeserve
