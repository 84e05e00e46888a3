#include "engine/scheduler.h"

#include <algorithm>

#include "engine/generator.h"

namespace moeserve {

bool Scheduler::ensure_blocks(Sequence& s, int64_t n_tokens) {
  int32_t need = blocks_for(s.n_computed + n_tokens) - int32_t(s.block_table.size());
  return need <= 0 || blocks_.allocate(need, &s.block_table);
}

void Scheduler::preempt(Sequence* victim) {
  blocks_.release(victim->block_table);
  victim->block_table.clear();
  victim->n_computed = 0;
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& p) { return p.get() == victim; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
  ++preemptions_;
}

std::vector<ScheduledSeq> Scheduler::schedule() {
  std::vector<ScheduledSeq> plan;
  int64_t budget = config_.max_batch_tokens;
  auto planned = [&](const Sequence* s) {
    return std::any_of(plan.begin(), plan.end(), [&](const ScheduledSeq& p) { return p.seq == s; });
  };
  // Pass 0: decodes (one token each). Pass 1: running sequences still prefilling.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence* s = running_[i].get();
      if (planned(s) || (pass == 0) != (s->n_uncomputed() == 1)) continue;
      int64_t n = std::min(s->n_uncomputed(), budget);
      bool preempted_self = false;
      while (!ensure_blocks(*s, n)) {
        // Out of blocks: preempt the most recently admitted sequence not in this step.
        Sequence* victim = nullptr;
        for (auto it = running_.rbegin(); it != running_.rend() && !victim; ++it) {
          if (!planned(it->get())) victim = it->get();
        }
        preempt(victim);  // s itself is unplanned, so a victim always exists
        if (victim == s) {
          preempted_self = true;
          break;
        }
      }
      if (preempted_self) break;
      plan.push_back({s, n, s->n_computed + n == int64_t(s->tokens.size())});
      budget -= n;
    }
  }
  // Admit waiting requests, oldest first.
  while (!waiting_.empty() && budget > 0 && int64_t(running_.size()) < config_.max_num_seqs) {
    Sequence* s = waiting_.front().get();
    // Reuse cached full blocks of the prefix, always leaving at least one token to compute
    // (its logits are needed).
    int32_t max_blocks = int32_t((int64_t(s->tokens.size()) - 1) / kKvBlockSize);
    int32_t hit = blocks_.acquire_prefix(s->tokens, max_blocks, &s->block_table);
    s->n_computed = int64_t(hit) * kKvBlockSize;
    int64_t n = std::min(s->n_uncomputed(), budget);
    if (!ensure_blocks(*s, n)) {
      blocks_.release(s->block_table);
      s->block_table.clear();
      s->n_computed = 0;
      break;
    }
    if (!s->admitted_before) {
      prefix_queries_ += s->n_prompt;
      s->n_cached_prompt = std::min(s->n_computed, s->n_prompt);
      prefix_hits_ += s->n_cached_prompt;
      s->admitted_before = true;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    plan.push_back({s, n, s->n_computed + n == int64_t(s->tokens.size())});
    budget -= n;
  }
  return plan;
}

void Scheduler::complete(const std::vector<ScheduledSeq>& plan) {
  for (const ScheduledSeq& p : plan) {
    Sequence& s = *p.seq;
    int64_t first_new_full = s.n_computed / kKvBlockSize;
    s.n_computed += p.n_tokens;
    for (int64_t b = first_new_full; b < s.n_computed / kKvBlockSize; ++b) {
      blocks_.register_full_block(s.tokens, s.block_table, int32_t(b));
    }
  }
}

std::unique_ptr<Sequence> Scheduler::remove(Sequence* seq) {
  for (auto* q : {&running_, &waiting_}) {
    auto it = std::find_if(q->begin(), q->end(), [&](const auto& p) { return p.get() == seq; });
    if (it == q->end()) continue;
    std::unique_ptr<Sequence> out = std::move(*it);
    q->erase(it);
    blocks_.release(out->block_table);
    out->block_table.clear();
    return out;
  }
  return nullptr;
}

}  // namespace moeserve
