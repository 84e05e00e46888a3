// The typed contract of one engine step (docs/engine.md "The step"):
//   Scheduler::schedule() -> StepPlan -> ModelRunner::run() -> StepResult
//   -> sampling fills StepResult::seqs[i].tokens -> Scheduler::commit(plan, result).
// Plain data; owned by the step thread for the duration of one step.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "engine/sequence.h"

namespace moeserve {

// One sequence's part of a step.
struct PlannedSeq {
  Sequence* seq = nullptr;
  // Tokens [seq->n_computed, + n_tokens) of seq->tokens run this step (a prefill chunk, or the
  // one token sampled last step), followed by `drafts`.
  int64_t n_tokens = 0;
  std::vector<int32_t> drafts;  // speculative tokens to verify after them (docs/mtp.md)
  // Logits (and final hidden rows) are needed for the last n_logits of the step's
  // n_tokens + drafts.size() positions: 0 mid-prefill, 1 to sample the next token, 1 + drafts
  // to verify drafts.
  int64_t n_logits = 0;

  int64_t n_rows() const { return n_tokens + int64_t(drafts.size()); }
};

struct StepPlan {
  std::vector<PlannedSeq> seqs;

  bool empty() const { return seqs.empty(); }
  int64_t n_rows() const {
    int64_t n = 0;
    for (const PlannedSeq& p : seqs) n += p.n_rows();
    return n;
  }
};

// What a step gave each planned sequence (StepResult::seqs, in plan order).
struct SeqResult {
  // Tokens to append, in order (filled by sampling): the sampled token, or the accepted drafts
  // plus the bonus token; empty mid-prefill.
  std::vector<GeneratedToken> tokens;
  // Of the plan's drafts, how many are final (their KV kept); the rest are rolled back.
  int64_t n_accepted_drafts = 0;
  // Constrained decoding: the grammar failed (the sequence ends with this error), and the time
  // its masks took this step.
  Status error;
  int64_t grammar_ns = 0;
};

struct StepResult {
  // Rows: every planned sequence's last n_logits positions, in plan order.
  std::vector<float> logits;  // [rows, vocab_size]
  std::vector<float> hidden;  // [rows, CausalLm::hidden_width()]: what the MTP module takes
  std::vector<SeqResult> seqs;
};

}  // namespace moeserve
