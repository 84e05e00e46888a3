// OpenAiService: the OpenAI-compatible endpoints, independent of the HTTP library. Each method
// takes the request body and returns a Reply: a complete JSON body, or an SSE stream that the
// HTTP layer pulls chunk by chunk. It validates (api_request.h), renders the chat template,
// tokenizes, checks the context, submits one engine request per choice, and turns the engine's
// tokens into text (choice_output.h), usage, logprobs and metrics.
//
// start_chat() is the core that the other chat-shaped APIs share: the Responses API
// (responses_api.h) and Anthropic's Messages API (messages_api.h) translate their requests into
// a ChatCompletionRequest, start it here, and format the GenerationRun in their own shape.
//
// Threading: every method may be called from any HTTP worker thread. A ReplyStream is used by
// one thread at a time. The Engine, the metrics and the service must outlive every Reply.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/api_request.h"
#include "server/metrics.h"
#include "server/reply.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve {

class GenerationJob;
class GenerationRun;
struct PreparedRequest;

struct ServiceOptions {
  std::string served_model_name = "moeserve";
  RequestLimits limits;         // vocab_size and max_context are taken from the engine
  bool split_reasoning = true;  // R1 templates: <think>...</think> -> reasoning_content
  // DeepSeek-V3.2-Speciale: every chat request in thinking mode; tools refused (400).
  bool reasoning_only = false;
  // The engine decodes speculatively: usage carries a "speculative" extension (docs/mtp.md).
  bool speculative = false;
  // Compiles response_format's grammars at the boundary (400 for a schema it cannot use); the
  // engine constrains with its own. Null: JSON response formats are refused.
  std::shared_ptr<GrammarBackend> grammar;
};

class OpenAiService {
 public:
  OpenAiService(Engine& engine, Tokenizer tokenizer, ChatTemplate chat_template,
                ServiceOptions options, ServerMetrics& metrics);
  ~OpenAiService();

  Reply chat_completions(std::string_view body, const RequestContext& ctx = {});
  Reply completions(std::string_view body, const RequestContext& ctx = {});
  Reply models() const;

  // Validates what parse_chat_request could not (the model, tools against the template),
  // renders, tokenizes and submits: a run for the caller to format. `id_prefix` begins the
  // run's id ("chatcmpl-", "resp_", "msg_").
  ApiResult<std::shared_ptr<GenerationRun>> start_chat(ChatCompletionRequest req,
                                                       std::string_view id_prefix,
                                                       const RequestContext& ctx = {});
  // The prompt's token count for `req`, as start_chat would submit it.
  ApiResult<int64_t> count_chat_tokens(ChatCompletionRequest req) const;

  // Cancels every engine request in flight (shutdown past its deadline).
  void cancel_all();
  // Generation requests being served (a stream counts until it ends or is dropped).
  int64_t in_flight() const;

  const std::string& served_model_name() const { return options_.served_model_name; }
  const RequestLimits& limits() const { return options_.limits; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const ChatTemplate& chat_template() const { return template_; }

 private:
  ApiResult<PreparedRequest> prepare_chat(ChatCompletionRequest& req) const;
  ApiResult<std::shared_ptr<GenerationRun>> start(PreparedRequest p, std::string_view id_prefix,
                                                  const RequestContext& ctx = {});
  Reply reply(std::shared_ptr<GenerationRun> run);  // the chat/completions shape
  Reply finish_blocking(GenerationRun& run);
  std::string new_id(std::string_view prefix);
  void track(const std::shared_ptr<GenerationJob>& job);

  Engine& engine_;
  const Tokenizer tokenizer_;
  const ChatTemplate template_;
  ServiceOptions options_;
  ServerMetrics& metrics_;
  const int64_t created_;  // unix time the service started (the model's "created")

  std::mutex mu_;
  std::mt19937_64 id_rng_;                          // guarded by mu_
  std::vector<std::weak_ptr<GenerationJob>> jobs_;  // guarded by mu_
  std::atomic<int64_t> in_flight_{0};
};

}  // namespace moeserve
