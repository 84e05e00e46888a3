#include "engine/generator.h"

#include <random>

#include <fmt/format.h>

namespace moeserve {

namespace {

struct Sequence {
  const GenerateRequest* req;
  std::vector<int32_t> tokens;  // prompt + generated
  std::vector<int32_t> block_table;
  int64_t n_cached = 0;  // tokens whose KV is in the cache
  std::mt19937_64 rng;
  GenerateResult result;
  bool done = false;
};

}  // namespace

Result<std::vector<GenerateResult>> Generator::generate(const std::vector<GenerateRequest>& requests,
                                                        int64_t prefill_chunk) {
  const ModelConfig& c = model_.config();
  std::vector<Sequence> seqs(requests.size());
  Status status;
  for (size_t i = 0; i < requests.size() && status.ok(); ++i) {
    const GenerateRequest& r = requests[i];
    if (r.prompt.empty()) status = InvalidArgument(fmt::format("request {}: empty prompt", i));
    int64_t total = int64_t(r.prompt.size()) + r.max_tokens;
    if (status.ok() && total > c.max_position_embeddings) {
      status = InvalidArgument(fmt::format(
          "request {}: prompt ({}) + max_tokens ({}) exceeds the context ({})", i,
          r.prompt.size(), r.max_tokens, c.max_position_embeddings));
    }
    if (status.ok() && !blocks_.allocate(blocks_for(total), &seqs[i].block_table)) {
      status = ResourceExhausted(fmt::format("request {}: not enough KV cache blocks for {} tokens", i, total));
    }
    seqs[i].req = &r;
    seqs[i].tokens = r.prompt;
    seqs[i].rng.seed(r.seed);
    seqs[i].done = r.max_tokens <= 0;
  }
  auto release = [&] {
    for (Sequence& s : seqs) {
      for (int32_t b : s.block_table) blocks_.free(b);
      s.block_table.clear();
    }
  };
  if (!status.ok()) {
    release();
    return status;
  }

  std::vector<float> logits, logprobs(size_t(c.vocab_size));
  for (;;) {
    // One step: every unfinished sequence contributes its uncached tokens (a prefill chunk or
    // the one token sampled last step).
    std::vector<StepSequence> batch;
    std::vector<Sequence*> owners;
    for (Sequence& s : seqs) {
      if (s.done) continue;
      int64_t n = int64_t(s.tokens.size()) - s.n_cached;
      if (prefill_chunk > 0) n = std::min(n, prefill_chunk);
      StepSequence step;
      step.tokens = std::span<const int32_t>(s.tokens).subspan(size_t(s.n_cached), size_t(n));
      step.start_pos = s.n_cached;
      step.block_table = s.block_table;
      step.want_logits = s.n_cached + n == int64_t(s.tokens.size());
      batch.push_back(step);
      owners.push_back(&s);
    }
    if (batch.empty()) break;
    Status st = model_.forward(batch, cache_, &logits);
    if (!st.ok()) {
      release();
      return st;
    }
    int64_t out_row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      Sequence& s = *owners[i];
      s.n_cached += int64_t(batch[i].tokens.size());
      if (!batch[i].want_logits) continue;
      const float* row = &logits[size_t(out_row++ * c.vocab_size)];
      int32_t tok = sample_token(row, c.vocab_size, s.req->sampling, s.rng);
      if (s.req->top_logprobs > 0) {
        log_softmax(row, c.vocab_size, logprobs.data());
        s.result.top_logprobs.push_back(top_logprobs(logprobs.data(), c.vocab_size, s.req->top_logprobs));
      }
      s.result.tokens.push_back(tok);
      s.tokens.push_back(tok);
      if (!s.req->ignore_eos && c.eos_token_id && tok == *c.eos_token_id) {
        s.result.finish = FinishReason::kStop;
        s.done = true;
      } else if (int64_t(s.result.tokens.size()) >= s.req->max_tokens) {
        s.done = true;
      }
    }
    if (after_step_) {
      if (Status a = after_step_(); !a.ok()) {
        release();
        return a;
      }
    }
  }
  release();
  std::vector<GenerateResult> out;
  for (Sequence& s : seqs) out.push_back(std::move(s.result));
  return out;
}

}  // namespace moeserve
