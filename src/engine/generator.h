// Generator: runs a fixed set of requests to completion as one batch, on EngineCore (prefill
// of all prompts, then one decode step per token for every unfinished sequence). The offline
// path of `moeserve generate` and of tests; the serving engine is the other client of the same
// step loop.
//
// Borrows the model and cache; the blocks its sequences take are released (registered blocks
// stay in the cache's prefix index) before it returns.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "cache/kv_cache.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "kernels/sampling.h"
#include "model/causal_lm.h"

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
  std::vector<float> logprobs;  // of each generated token (when top_logprobs > 0)
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // one list per generated token
  FinishReason finish = FinishReason::kLength;
  int64_t cached_prompt_tokens = 0;  // found in the prefix cache
  int64_t draft_tokens = 0;          // MTP drafts verified for this request, and accepted
  int64_t accepted_draft_tokens = 0;
};

class Generator {
 public:
  // speculative: MTP speculative decoding (engine_core.h); the cache then needs the MTP layer.
  Generator(CausalLm& model, KvCache& cache, ThreadPool* pool = nullptr,
            const SpeculativeConfig& speculative = {})
      : model_(model), cache_(cache), pool_(pool), spec_(speculative) {}

  // Prompts longer than `prefill_chunk` tokens are prefilled in several steps (0: one step).
  // InvalidArgument for a bad request, ResourceExhausted when the cache cannot hold them all.
  Result<std::vector<GenerateResult>> generate(const std::vector<GenerateRequest>& requests,
                                               int64_t prefill_chunk = 0);
  // Called after every step (e.g. ExpertBalancer::end_step on every rank of an EP group); an
  // error ends generate() with it.
  void set_after_step(std::function<Status()> f) { after_step_ = std::move(f); }
  // The step loop's counters of the last generate() (steps, speculative acceptance).
  const EngineCoreStats& stats() const { return stats_; }

 private:
  CausalLm& model_;
  KvCache& cache_;
  ThreadPool* pool_;
  SpeculativeConfig spec_;
  std::function<Status()> after_step_;
  EngineCoreStats stats_;
};

}  // namespace moeserve
