// GenerationRun: one API request while it is served, whatever API it came in by (chat and
// completions in openai_service.cpp, the Responses API in responses_api.h, Anthropic's Messages
// API in messages_api.h): the engine job, one ChoiceOutput per choice, usage and the latency
// metrics. Each API formats what pump() hands it in its own shape.
//
// Threading: used by one HTTP thread at a time; the engine's callbacks only touch the job.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/api_request.h"
#include "server/choice_output.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace moeserve {

class GenerationJob;
struct JobEvent;

// A validated, tokenized request, ready for the engine.
struct PreparedRequest {
  bool chat = true;
  std::vector<int32_t> prompt;
  GenerationOptions gen;
  ReasoningMode reasoning;
  ToolCallMode tools;
  std::string echo;  // completions with echo: the prompt's text, before each choice's
  // A resumed stream (Last-Event-ID: the events up to this id are the client's already): the
  // stream leaves them out; pump() ends a delta at the tokens they account for.
  std::optional<int64_t> resume_after;
  // SSE events carry `id:` lines (docs/fault-tolerance.md): only a keyed request (Idempotency-Key)
  // can be resumed, so only its stream has them; others are `data:` lines alone, as OpenAI's,
  // vLLM's and SGLang's streams are (clients such as `vllm bench serve` read nothing else).
  bool event_ids = false;
};

// What a run reads and reports to; owned by the service, which outlives every run.
struct RunContext {
  Engine& engine;
  const Tokenizer& tokenizer;
  ServerMetrics& metrics;
  bool speculative = false;         // usage carries the MTP extension
  std::atomic<int64_t>& in_flight;  // incremented by whoever starts the run
};

struct RunUsage {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t draft_tokens = 0, accepted_draft_tokens = 0;  // MTP
};

// One choice's output gathered whole (a reply that is not streamed).
struct ChoiceText {
  std::string reasoning, content;
  std::vector<ParsedToolCall> calls;
  std::vector<GeneratedToken> tokens;  // only when `keep_tokens` was asked of add()

  void add(const ChoiceDelta& d, bool keep_tokens);
};

class GenerationRun {
 public:
  using Clock = std::chrono::steady_clock;

  struct ChoiceState {
    std::optional<ChoiceOutput> out;
    std::optional<Clock::time_point> last_token;
    int64_t draft_tokens = 0, accepted_draft_tokens = 0;  // MTP, so far
  };

  // The run owns one count of ctx.in_flight from here on.
  GenerationRun(const RunContext& ctx, PreparedRequest p, std::string id,
                std::shared_ptr<GenerationJob> job, Clock::time_point t0);
  ~GenerationRun();  // cancels what is still generating (the client went away)

  bool done() const;
  // Processes what the engine delivered (waiting up to `wait`), calling sink for each delta.
  void pump(std::chrono::milliseconds wait, const std::function<void(int, ChoiceDelta&)>& sink);
  // The id of the SSE event after the deltas so far: the tokens the choices have accounted for,
  // and one for each choice that has finished (a function of the tokens alone, whatever batches
  // the engine delivered them in; the role chunk before them is 0).
  int64_t event_id() const;
  // Pumps until every choice has finished (or the run failed): the whole reply.
  std::vector<ChoiceText> collect();
  // The client went away: cancels the engine requests.
  void abandon();

  // A tool call's id: unique per run, choice and call.
  std::string call_id(int choice, int64_t index) const;
  RunUsage usage() const;

  const RunContext ctx;
  const PreparedRequest p;
  const std::string id;
  const Clock::time_point t0;
  const int64_t created;  // unix time
  std::vector<ChoiceState> choices;
  std::optional<ApiError> error;

 private:
  void observe_tokens(ChoiceState& c, int64_t n, Clock::time_point at);
  void finished_choice(const JobEvent& ev, const ChoiceDelta& d);  // its metrics

  const std::shared_ptr<GenerationJob> job_;
  int64_t cached_prompt_tokens_ = 0;
};

}  // namespace moeserve
