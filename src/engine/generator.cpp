#include "engine/generator.h"

#include <limits>
#include <string>

#include <fmt/format.h>

#include "engine/engine_core.h"

namespace moeserve {

Result<std::vector<GenerateResult>> Generator::generate(
    const std::vector<GenerateRequest>& requests, int64_t prefill_chunk) {
  const ModelConfig& c = model_.config();
  int64_t blocks = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerateRequest& r = requests[i];
    RETURN_IF_ERROR(validate_prompt(c, r.prompt, r.max_tokens, c.max_position_embeddings)
                        .with_context(fmt::format("request {}", i)));
    const int64_t total = int64_t(r.prompt.size()) + r.max_tokens;
    blocks += blocks_for(total);  // (drafts never reach past it: docs/mtp.md)
    if (blocks > cache_.num_available()) {
      return ResourceExhausted(
          fmt::format("request {}: not enough KV cache blocks for {} tokens", i, total));
    }
  }
  // Every sequence runs every step (no token budget, no admission limit): the whole batch is
  // prefilled in the first step(s), then decodes one token each per step.
  SchedulerConfig all_at_once;
  all_at_once.max_num_seqs = std::max<int64_t>(1, int64_t(requests.size()));
  all_at_once.max_batch_tokens = std::numeric_limits<int64_t>::max();
  all_at_once.max_chunk_tokens = prefill_chunk;
  all_at_once.await_loads = true;  // EP ranks run the same batch in lockstep
  EngineCore core(model_, cache_, all_at_once, pool_, nullptr, spec_);
  std::vector<GenerateResult> results(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerateRequest& g = requests[i];
    if (g.max_tokens <= 0) continue;
    EngineRequest r;
    r.id = std::to_string(i);
    r.prompt = g.prompt;
    r.max_tokens = g.max_tokens;
    r.sampling = g.sampling;
    r.seed = g.seed;
    r.ignore_eos = g.ignore_eos;
    r.logprobs = g.top_logprobs > 0;
    r.top_logprobs = g.top_logprobs;
    core.add(std::move(r), [&res = results[i], top = g.top_logprobs](const RequestOutput& out) {
      for (const GeneratedToken& t : out.tokens) {
        res.tokens.push_back(t.id);
        if (top > 0) {
          res.logprobs.push_back(t.logprob);
          res.top_logprobs.push_back(t.top);
        }
      }
      res.cached_prompt_tokens = out.cached_prompt_tokens;
      res.draft_tokens = out.draft_tokens;
      res.accepted_draft_tokens = out.accepted_draft_tokens;
      if (out.finished) res.finish = out.finish_reason;
    });
  }
  Status st;
  while (st.ok() && !core.idle()) {
    st = core.step();
    if (st.ok() && after_step_) st = after_step_();
  }
  stats_ = core.stats();
  if (!st.ok()) {
    core.finish_all(FinishReason::kError, st);  // releases their blocks
    return st;
  }
  return results;
}

}  // namespace moeserve
