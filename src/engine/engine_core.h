// EngineCore: the one step loop every client drives (docs/engine.md "The step"):
//
//   StepPlan plan = scheduler.schedule();     // who computes which tokens
//   StepResult r = runner.run(plan);          // the model forward: logits, final hidden rows
//   sample(plan, r);                          // tokens (and accepted drafts) per sequence
//   scheduler.commit(plan, r);                // advance / roll back, register final blocks
//   emit(plan, r);                            // callbacks, stop checks, finishing
//
// step() does all of it; schedule() and run(plan) are the same two halves for a client that
// must agree with other ranks between them (the data-parallel rank protocol, dp_control.h).
// Clients: Generator (a fixed batch to completion) and the serving engine (llm_engine.cpp).
//
// Borrows the model, cache and pool (they outlive it). Not thread-safe: every call comes from
// one thread (the engine's step thread); callbacks run on it, in order, and may call cancel().
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/kv_cache.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "core/trace.h"
#include "engine/draft_policy.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/step.h"
#include "model/causal_lm.h"

namespace moeserve {

// Executes a plan on the model: builds the batch (tokens, positions, block tables, logit rows)
// and returns the logits and final hidden rows of the positions the plan asks for.
class ModelRunner {
 public:
  // all_hidden: the final hidden row of every planned position, not only of those with logits
  // (the MTP module reads them all).
  ModelRunner(CausalLm& model, KvCache& cache, bool all_hidden = false)
      : model_(model), cache_(cache), all_hidden_(all_hidden) {}
  Status run(const StepPlan& plan, StepResult* result);

 private:
  CausalLm& model_;
  KvCache& cache_;
  bool all_hidden_;
  StepOutput out_;
  std::vector<std::vector<int32_t>> rows_with_drafts_;
};

// The checks every client makes of a request at its boundary (the core trusts them): a
// non-empty prompt of ids in the vocabulary, and prompt + max_tokens within max_context.
Status validate_prompt(const ModelConfig& config, std::span<const int32_t> prompt,
                       int64_t max_tokens, int64_t max_context);

// MTP speculative decoding (docs/mtp.md).
struct SpeculativeConfig {
  int64_t num_draft_tokens = 0;  // K, 0..EngineStats::kMaxDraftTokens; 0: off
  // The load policy. -1 (default): measured (DraftPolicy: per number of decoding sequences,
  // the k in [0, K] with the most tokens per second so far). > 0: a step plans the largest
  // k <= K whose decode rows (sequences x (1 + k)) stay within max_rows, none when even k = 1
  // does not fit. 0: always K.
  int64_t max_rows = -1;
};

// The figures EngineCore keeps: EngineStats' prompt_tokens (of finished requests, errors
// excluded), generated_tokens, steps, spec_* and grammar_* (the rest stay zero; the engine
// adds the scheduler's, the cache's and the disk tier's).
using EngineCoreStats = EngineStats;

class EngineCore {
 public:
  // With speculative.num_draft_tokens > 0 the model must have its MTP module and the cache
  // its layer (kv_cache_layout(..., mtp = true)).
  EngineCore(CausalLm& model, KvCache& cache, const SchedulerConfig& scheduling, ThreadPool* pool,
             Tracer* tracer = nullptr, const SpeculativeConfig& speculative = {});

  // Where requests with a grammar get their constraints (none: such requests end with an
  // error). Shared: the serving engine checks specs with it at its boundary.
  void set_grammar_backend(std::shared_ptr<GrammarBackend> b) { grammar_ = std::move(b); }

  // A request (validated by the caller, seed set) and where its outputs go.
  void add(EngineRequest request, OutputCallback callback);
  // Ends a live request with kCancelled (unknown ids: ignored).
  void cancel(const std::string& id);

  StepPlan schedule() { return scheduler_.schedule(); }
  // Runs a scheduled plan to its callbacks. A failed forward ends the plan's requests with
  // kError and returns the error.
  Status run(const StepPlan& plan);
  // schedule() + run(); an empty plan runs nothing (with only loads from the lower tier in
  // flight, it waits for one to finish).
  Status step();

  // Ends every live request (callbacks with `reason`).
  void finish_all(FinishReason reason, const Status& error);

  bool idle() const { return scheduler_.idle(); }
  const Scheduler& scheduler() const { return scheduler_; }
  const KvCache& cache() const { return cache_; }
  const EngineCoreStats& stats() const { return stats_; }
  const ModelConfig& config() const { return model_.config(); }

 private:
  void sample(const StepPlan& plan, StepResult& r);
  // The MTP module over the step's final positions (its latent cache keeps pace with the main
  // model's), then its drafts for each decoding sequence's next step (docs/mtp.md).
  Status propose(const StepPlan& plan, const StepResult& r);
  // How many drafts a decoding sequence gets next step under the load policy.
  int64_t drafts_per_sequence();
  void emit(const StepPlan& plan, StepResult& r);
  void finish(Sequence* s, FinishReason reason, std::vector<GeneratedToken> last, Status error,
              std::shared_ptr<const KvHandoff> handoff = nullptr);
  void hand_off(Sequence* s, std::vector<GeneratedToken> last);

  CausalLm& model_;
  KvCache& cache_;
  ThreadPool* pool_;
  Tracer* tracer_;
  Scheduler scheduler_;
  ModelRunner runner_;
  SpeculativeConfig spec_;
  DraftPolicy policy_;
  std::shared_ptr<GrammarBackend> grammar_;
  int64_t k_proposed_ = 0;  // drafts per sequence the last propose() chose
  StepResult result_;
  StepOutput mtp_out_;
  std::unordered_map<std::string, Sequence*> live_;
  EngineCoreStats stats_;
};

}  // namespace moeserve
