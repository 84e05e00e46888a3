// Scheduler: continuous batching with chunked prefill and a per-step token budget.
//
// Each step: every running sequence in decode gets its one token first; then running sequences
// still prefilling get chunks; then waiting requests are admitted (prefix-cache lookup first)
// while the token budget, max_num_seqs and free KV blocks allow. When a running sequence needs a
// new block and none is free, the most recently admitted running sequence is preempted: its
// blocks are released and it goes back to the front of the queue, to be recomputed later
// (its prompt and generated tokens, much of it usually from the prefix cache).
//
// Not thread-safe: owned by the engine's step thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "cache/block_manager.h"
#include "engine/sequence.h"

namespace moeserve {

struct SchedulerConfig {
  int64_t max_num_seqs = 64;
  int64_t max_batch_tokens = 2048;  // tokens per step (decode tokens + prefill chunks)
};

struct ScheduledSeq {
  Sequence* seq;
  int64_t n_tokens;  // tokens [seq->n_computed, + n_tokens) run this step
  bool want_logits;  // the chunk reaches the end of the sequence's tokens
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvBlockManager& blocks)
      : config_(config), blocks_(blocks) {}

  void add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }
  std::vector<ScheduledSeq> schedule();
  // After the step ran: advance n_computed and register newly full blocks in the prefix cache.
  void complete(const std::vector<ScheduledSeq>& plan);
  // Removes a finished or cancelled sequence (running or waiting), releasing its blocks.
  std::unique_ptr<Sequence> remove(Sequence* seq);

  const std::deque<std::unique_ptr<Sequence>>& running() const { return running_; }
  const std::deque<std::unique_ptr<Sequence>>& waiting() const { return waiting_; }
  int64_t preemptions() const { return preemptions_; }
  int64_t prefix_queries() const { return prefix_queries_; }
  int64_t prefix_hits() const { return prefix_hits_; }

 private:
  bool ensure_blocks(Sequence& s, int64_t n_tokens);
  void preempt(Sequence* victim);

  SchedulerConfig config_;
  KvBlockManager& blocks_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::deque<std::unique_ptr<Sequence>> running_;  // admission order
  int64_t preemptions_ = 0;
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
};

}  // namespace moeserve
