// Scheduler: continuous batching with chunked prefill and a per-step token budget; the owner of
// every sequence's state transitions but finishing (docs/engine.md).
//
// Each step: sequences whose KV finished loading from the lower tier join the running ones;
// every running sequence in decode gets its one token first (with the drafts the MTP module
// proposed for it, budget allowing); then running sequences still
// prefilling get chunks (at most max_chunk_tokens each, when set); then waiting requests are
// admitted while the token budget, max_num_seqs and free KV blocks allow. Admission looks up
// the prompt's full blocks in RAM first; when the lower tier holds the next block, the
// sequence waits in the loading-KV state (blocks reserved, no tokens planned) while the tier's
// thread fills them, and other sequences keep stepping. When a running sequence needs a new block
// and none is free, the most recently admitted running sequence is preempted: its blocks are
// released and it goes back to the front of the queue, to be recomputed later (its prompt and
// generated tokens, much of it usually from the prefix cache).
//
// Not thread-safe: owned by the engine's step thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "cache/kv_cache.h"
#include "engine/sequence.h"
#include "engine/step.h"

namespace moeserve {

struct SchedulerConfig {
  int64_t max_num_seqs = 64;
  int64_t max_batch_tokens = 2048;  // tokens per step (decode tokens + prefill chunks)
  int64_t max_chunk_tokens = 0;     // prefill tokens of one sequence per step (0: no limit)
  // Loads from the lower tier finish within the schedule() that starts them: the plan does not
  // depend on I/O timing (a fixed batch run in lockstep on several EP ranks needs that).
  bool await_loads = false;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCache& cache) : config_(config), cache_(cache) {}

  void add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }
  StepPlan schedule();
  // After the step ran and was sampled: each sequence keeps the KV of its planned tokens and
  // of its accepted drafts (the rest is rolled back: those slots are rewritten later), takes
  // result.seqs[i].tokens, registers the blocks whose tokens are now final in the prefix
  // index (unless !register_blocks: then register_final_blocks() does it), and moves from
  // prefill to decode once it has sampled.
  void commit(const StepPlan& plan, const StepResult& result, bool register_blocks = true);
  // The prefix-index step of commit(), on its own: with MTP the blocks are registered (and so
  // copied to the disk tier) only once the module's layer is written too (docs/mtp.md).
  void register_final_blocks(const StepPlan& plan);
  // Blocks for the positions a running sequence's next step would compute with k drafts (and
  // that chaining the MTP module writes first): k if they are (or could be) allocated, else
  // the largest k' < k that fits without preempting anyone (docs/mtp.md).
  int64_t reserve_drafts(Sequence& s, int64_t k);
  // Removes a sequence (running or waiting), releasing its blocks; it becomes finished.
  std::unique_ptr<Sequence> remove(Sequence* seq);

  bool idle() const { return running_.empty() && waiting_.empty() && loading_.empty(); }
  // Whether schedule() could plan something now or soon without new requests: anything
  // running or waiting, or a load that has finished. (Only loads in flight: nothing to do
  // until one finishes; KvCache::wait_for_load waits for that.)
  bool has_work() const;
  // A sequence's load from the lower tier has finished (it runs at the next schedule()).
  bool has_finished_load() const;
  const std::deque<std::unique_ptr<Sequence>>& running() const { return running_; }
  const std::deque<std::unique_ptr<Sequence>>& waiting() const { return waiting_; }
  const std::deque<std::unique_ptr<Sequence>>& loading() const { return loading_; }
  int64_t preemptions() const { return preemptions_; }
  int64_t prefix_queries() const { return prefix_queries_; }
  int64_t prefix_hits() const { return prefix_hits_; }  // tokens, from RAM and the lower tier
  int64_t prefix_hits_lower() const { return prefix_hits_lower_; }  // of those, the lower tier

 private:
  void take_loaded();
  void register_final_blocks(Sequence& s);
  void plan_running(SeqState pass, StepPlan& plan, int64_t& budget);
  void admit(StepPlan& plan, int64_t& budget);
  void count_admission(Sequence& s, int64_t lower_tokens);
  bool import_kv(Sequence& s);
  bool ensure_blocks(Sequence& s, int64_t n_tokens);
  void preempt(Sequence* victim);
  void drop_blocks(Sequence& s);
  // Lets go of the window pages of s's blocks behind every window (KvCache::window_trim_point).
  void trim_windows(Sequence& s);
  int64_t chunk(const Sequence& s, int64_t budget) const;

  SchedulerConfig config_;
  KvCache& cache_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::deque<std::unique_ptr<Sequence>> running_;  // admission order
  std::deque<std::unique_ptr<Sequence>> loading_;  // KV on its way from the lower tier
  int64_t preemptions_ = 0;
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
  int64_t prefix_hits_lower_ = 0;
};

}  // namespace moeserve
