#include "engine/engine_core.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/check.h"
#include "kernels/sampling.h"

namespace moeserve {

Status validate_prompt(const ModelConfig& c, std::span<const int32_t> prompt, int64_t max_tokens,
                       int64_t max_context) {
  if (prompt.empty()) return InvalidArgument("the prompt is empty");
  for (int32_t t : prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return InvalidArgument(
          fmt::format("token id {} outside the vocabulary [0, {})", t, c.vocab_size));
    }
  }
  const int64_t total = int64_t(prompt.size()) + max_tokens;
  if (total > max_context) {
    return InvalidArgument(
        fmt::format("prompt ({} tokens) + max_tokens ({}) = {} exceeds the context length ({})",
                    prompt.size(), max_tokens, total, max_context));
  }
  return Status::Ok();
}

Status ModelRunner::run(const StepPlan& plan, StepResult* result) {
  std::vector<StepSequence> batch;
  batch.reserve(plan.seqs.size());
  rows_with_drafts_.resize(plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const PlannedSeq& p = plan.seqs[i];
    const Sequence& s = *p.seq;
    std::span<const int32_t> tokens =
        std::span<const int32_t>(s.tokens).subspan(size_t(s.n_computed), size_t(p.n_tokens));
    if (!p.drafts.empty()) {  // [n_tokens + drafts] in one buffer
      std::vector<int32_t>& row = rows_with_drafts_[i];
      row.assign(tokens.begin(), tokens.end());
      row.insert(row.end(), p.drafts.begin(), p.drafts.end());
      tokens = row;
    }
    batch.push_back({tokens, s.n_computed, s.block_table, p.n_logits});
  }
  RETURN_IF_ERROR(model_.forward(batch, cache_, &out_));
  std::swap(result->logits, out_.logits);
  std::swap(result->hidden, out_.hidden);
  return Status::Ok();
}

EngineCore::EngineCore(DeepseekModel& model, KvCache& cache, const SchedulerConfig& scheduling,
                       ThreadPool* pool, Tracer* tracer)
    : model_(model),
      cache_(cache),
      pool_(pool),
      tracer_(tracer),
      scheduler_(scheduling, cache),
      runner_(model, cache) {}

void EngineCore::add(EngineRequest r, OutputCallback callback) {
  CHECK(r.seed.has_value(), "a request reaches the engine core with its seed set");
  auto s = std::make_unique<Sequence>();
  s->tokens = r.prompt;
  s->n_prompt = int64_t(r.prompt.size());
  s->rng.seed(*r.seed);
  s->req = std::move(r);
  s->callback = std::move(callback);
  live_[s->req.id] = s.get();
  scheduler_.add(std::move(s));
}

void EngineCore::cancel(const std::string& id) {
  auto it = live_.find(id);
  if (it != live_.end()) finish(it->second, FinishReason::kCancelled, {}, Status::Ok());
}

Status EngineCore::step() {
  StepPlan plan = schedule();
  if (!plan.empty()) return run(plan);
  // Nothing to run while KV is loading from the lower tier: wait for it rather than spin.
  if (!scheduler_.has_work() && !scheduler_.loading().empty()) cache_.wait_for_load();
  return Status::Ok();
}

Status EngineCore::run(const StepPlan& plan) {
  result_.seqs.assign(plan.seqs.size(), SeqResult{});
  Status st;
  {
    TraceSpan span(tracer_, "step", stats_.steps);
    st = runner_.run(plan, &result_);
  }
  if (!st.ok()) {
    for (const PlannedSeq& p : plan.seqs) finish(p.seq, FinishReason::kError, {}, st);
    return st;
  }
  sample(plan, result_);
  scheduler_.commit(plan, result_);
  emit(plan, result_);
  ++stats_.steps;
  return Status::Ok();
}

// Sampling (and log-softmax over the vocabulary for requests that want logprobs), the rows in
// parallel: each row uses only its own sequence's sampler state, so the results do not depend
// on the split.
void EngineCore::sample(const StepPlan& plan, StepResult& r) {
  std::vector<size_t> sampled;  // plan indices with a logits row (one each: no drafts yet)
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    CHECK(plan.seqs[i].drafts.empty() && plan.seqs[i].n_logits <= 1,
          "draft verification is not wired into sampling yet");
    if (plan.seqs[i].n_logits == 1) sampled.push_back(i);
  }
  const int64_t V = model_.config().vocab_size;
  auto rows = [&](int64_t i0, int64_t i1) {
    std::vector<float> lp;  // [V], sized on first use
    for (int64_t i = i0; i < i1; ++i) {
      Sequence& s = *plan.seqs[sampled[size_t(i)]].seq;
      const float* l = &r.logits[size_t(i * V)];
      GeneratedToken g{sample_token(l, V, s.req.sampling, s.rng), 0.0f, {}};
      if (s.req.logprobs) {
        lp.resize(static_cast<size_t>(V));
        log_softmax(l, V, lp.data());
        g.logprob = lp[size_t(g.id)];
        if (s.req.top_logprobs > 0) g.top = top_logprobs(lp.data(), V, s.req.top_logprobs);
      }
      r.seqs[sampled[size_t(i)]].tokens.push_back(std::move(g));
    }
  };
  pool_ ? pool_->parallel_for(int64_t(sampled.size()), rows) : rows(0, int64_t(sampled.size()));
}

void EngineCore::emit(const StepPlan& plan, StepResult& r) {
  const std::optional<int64_t> eos = model_.config().eos_token_id;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    Sequence& s = *plan.seqs[i].seq;
    RequestOutput out;
    bool finished = false;  // (finish() destroys s)
    for (size_t k = 0; !finished && k < r.seqs[i].tokens.size(); ++k) {
      GeneratedToken& g = r.seqs[i].tokens[k];
      const int32_t tok = g.id;
      const int64_t n_generated = s.n_generated() - int64_t(r.seqs[i].tokens.size() - 1 - k);
      out.tokens.push_back(std::move(g));
      ++stats_.generated_tokens;
      const std::vector<int32_t>& stops = s.req.stop_token_ids;
      if ((!s.req.ignore_eos && eos && tok == *eos) ||
          std::find(stops.begin(), stops.end(), tok) != stops.end()) {
        finish(&s, FinishReason::kStop, std::move(out.tokens), Status::Ok());
        finished = true;
      } else if (n_generated >= s.req.max_tokens) {
        finish(&s, FinishReason::kLength, std::move(out.tokens), Status::Ok());
        finished = true;
      }
    }
    if (finished || out.tokens.empty()) continue;
    out.prompt_tokens = s.n_prompt;
    out.cached_prompt_tokens = s.n_cached_prompt;
    s.callback(out);
  }
}

void EngineCore::finish(Sequence* s, FinishReason reason, std::vector<GeneratedToken> last,
                        Status error) {
  RequestOutput out;
  out.tokens = std::move(last);
  out.finished = true;
  out.finish_reason = reason;
  out.error = std::move(error);
  out.prompt_tokens = s->n_prompt;
  out.cached_prompt_tokens = s->n_cached_prompt;
  live_.erase(s->req.id);
  std::unique_ptr<Sequence> owned = scheduler_.remove(s);
  if (reason != FinishReason::kError) stats_.prompt_tokens += s->n_prompt;
  owned->callback(out);
}

void EngineCore::finish_all(FinishReason reason, const Status& error) {
  while (!live_.empty()) finish(live_.begin()->second, reason, {}, error);
}

}  // namespace moeserve
