#include "server/generation_run.h"

#include <ctime>

#include <fmt/format.h>

#include "core/check.h"
#include "server/api_json.h"
#include "server/generation_job.h"

namespace moeserve {

namespace {
double seconds(GenerationRun::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
}  // namespace

void ChoiceText::add(const ChoiceDelta& d, bool keep_tokens) {
  reasoning += d.reasoning;
  content += d.content;
  for (const ToolCallDelta& c : d.tool_calls) {
    if (c.opens) calls.push_back({c.type, c.name, ""});
    CHECK(size_t(c.index) < calls.size(), "tool call arguments before the call opened");
    calls[size_t(c.index)].arguments += c.arguments;
  }
  if (keep_tokens) tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
}

GenerationRun::GenerationRun(const RunContext& ctx, PreparedRequest p, std::string id,
                             std::shared_ptr<GenerationJob> job, Clock::time_point t0)
    : ctx(ctx),
      p(std::move(p)),
      id(std::move(id)),
      t0(t0),
      created(std::time(nullptr)),
      job_(std::move(job)) {
  for (int64_t i = 0; i < this->p.gen.n; ++i) {
    choices.emplace_back();
    choices.back().out.emplace(ctx.tokenizer, this->p.gen.stop, this->p.reasoning, this->p.tools);
  }
}

GenerationRun::~GenerationRun() {
  if (!done()) {  // the client went away mid-stream
    job_->cancel_all();
    for (const ChoiceState& c : choices) {
      if (!c.out->finished()) ctx.metrics.count_finish("abort");
    }
  }
  --ctx.in_flight;
}

bool GenerationRun::done() const {
  if (error) return true;
  for (const ChoiceState& c : choices) {
    if (!c.out->finished()) return false;
  }
  return true;
}

void GenerationRun::abandon() {
  job_->cancel_all();
}

void GenerationRun::pump(std::chrono::milliseconds wait,
                         const std::function<void(int, ChoiceDelta&)>& sink) {
  std::vector<JobEvent> events;
  job_->wait(events, wait);
  if (events.empty() && !error && !ctx.engine.healthy() && job_->live() > 0) {
    // The engine stopped without finishing these requests: nothing more will come.
    error = error_from_status(Unavailable("the engine has stopped"));
    return;
  }
  for (JobEvent& ev : events) {
    if (error) break;
    ChoiceState& c = choices[size_t(ev.choice)];
    if (c.out->finished()) continue;
    const RequestOutput& o = ev.output;
    if (ev.choice == 0) cached_prompt_tokens_ = o.cached_prompt_tokens;
    c.draft_tokens = o.draft_tokens;
    c.accepted_draft_tokens = o.accepted_draft_tokens;
    if (!o.tokens.empty()) observe_tokens(c, int64_t(o.tokens.size()), ev.at);
    if (o.finished && o.finish_reason == FinishReason::kError) {
      error = ApiError{500, "generation failed: " + o.error.to_string(), "internal_error",
                       std::nullopt, std::nullopt};
      ctx.metrics.count_finish("error");
      job_->cancel_all();
      break;
    }
    // A resumed stream: a delta ends where the client's tokens end, so that the stream can leave
    // out the events it has (their ids are the tokens accounted for: event_id()).
    std::span<const GeneratedToken> tokens(o.tokens);
    if (p.resume_after && ev.choice == 0 && c.out->completion_tokens() < *p.resume_after) {
      const size_t head = size_t(
          std::min<int64_t>(*p.resume_after - c.out->completion_tokens(), int64_t(tokens.size())));
      ChoiceDelta d = c.out->on_tokens(tokens.first(head));
      tokens = tokens.subspan(head);
      if (c.out->stopped_by_string()) job_->cancel_choice(ev.choice);
      finished_choice(ev, d);
      sink(ev.choice, d);
      if (c.out->finished() || (tokens.empty() && !o.finished)) continue;
    }
    ChoiceDelta d = c.out->on_tokens(tokens);
    if (c.out->stopped_by_string()) job_->cancel_choice(ev.choice);
    if (!c.out->finished() && o.finished) {
      ChoiceDelta tail = c.out->on_finish(o.finish_reason);
      d.reasoning += tail.reasoning;
      d.content += tail.content;
      d.tool_calls.insert(d.tool_calls.end(), tail.tool_calls.begin(), tail.tool_calls.end());
      d.finish_reason = tail.finish_reason;
    }
    finished_choice(ev, d);
    sink(ev.choice, d);
  }
}

void GenerationRun::finished_choice(const JobEvent& ev, const ChoiceDelta& d) {
  if (!d.finish_reason) return;
  ctx.metrics.observe_e2e(seconds(ev.at - t0));
  ctx.metrics.count_finish(*d.finish_reason);
}

std::vector<ChoiceText> GenerationRun::collect() {
  std::vector<ChoiceText> out(choices.size());
  const bool keep_tokens = p.gen.logprobs;
  while (!done()) {
    pump(std::chrono::milliseconds(200),
         [&](int i, ChoiceDelta& d) { out[size_t(i)].add(d, keep_tokens); });
  }
  return out;
}

int64_t GenerationRun::event_id() const {
  int64_t n = 0;
  for (const ChoiceState& c : choices)
    n += c.out->completion_tokens() + (c.out->finished() ? 1 : 0);
  return n;
}

std::string GenerationRun::call_id(int choice, int64_t index) const {
  return fmt::format("call_{}{:02x}{:02x}", id_suffix(id), choice, index);
}

RunUsage GenerationRun::usage() const {
  RunUsage u;
  u.prompt_tokens = int64_t(p.prompt.size());
  u.cached_prompt_tokens = cached_prompt_tokens_;
  for (const ChoiceState& c : choices) {
    u.completion_tokens += c.out->completion_tokens();
    u.draft_tokens += c.draft_tokens;
    u.accepted_draft_tokens += c.accepted_draft_tokens;
  }
  return u;
}

void GenerationRun::observe_tokens(ChoiceState& c, int64_t n, Clock::time_point at) {
  if (!c.last_token) {
    ctx.metrics.observe_ttft(seconds(at - t0));
  } else {  // tokens delivered together share the gap
    const double gap = seconds(at - *c.last_token) / double(n);
    for (int64_t k = 0; k < n; ++k) ctx.metrics.observe_inter_token(gap);
  }
  c.last_token = at;
}

}  // namespace moeserve
