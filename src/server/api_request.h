// The OpenAI API requests the server accepts, one typed struct per kind, and their parsers.
// Parsing validates everything that can be checked without the tokenizer (JSON syntax, types,
// ranges, caps), once, at the boundary; the handlers then trust the structs. Checks that need
// the prompt's token count (prompt + max_tokens beyond the context) are the handlers'.
//
// Unknown fields are ignored, as vLLM does. Fields the server cannot honour (suffix, echo with
// logprobs) are rejected with 400 rather than silently ignored.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/grammar.h"
#include "server/api_error.h"
#include "tokenizer/chat_template.h"

namespace moeserve {

// Caps on what one request may ask for (server flags); vocab_size and max_context come from
// the engine.
struct RequestLimits {
  int64_t max_n = 8;
  int64_t max_top_logprobs = 20;
  int64_t max_stop_strings = 16;
  int64_t max_stop_bytes = 256;  // per stop string
  int64_t max_stop_token_ids = 64;
  int64_t vocab_size = 0;
  int64_t max_context = 0;
};

// The generation fields shared by chat and completions.
struct GenerationOptions {
  std::optional<int64_t> max_tokens;  // nullopt: up to the context
  float temperature = 1.0f;           // OpenAI's default
  float top_p = 1.0f;
  int64_t top_k = 0;   // vLLM extension; 0: all
  float min_p = 0.0f;  // vLLM extension
  // OpenAI's presence and frequency penalties ([-2, 2]) and logit_bias ({"token id": bias in
  // [-100, 100]}, as (id, bias) in id order), vLLM's repetition_penalty (> 0): the engine's
  // SamplingParams (kernels/sampling.h).
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;        // non-empty, valid UTF-8
  std::vector<int32_t> stop_token_ids;  // vLLM extension, each < vocab_size
  int64_t n = 1;                        // choices, in [1, max_n]
  bool logprobs = false;
  int64_t top_logprobs = 0;  // in [0, max_top_logprobs]; only with logprobs
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // vLLM extension
  // response_format json_object / json_schema (start_after unset: the handler knows whether the
  // output begins with reasoning).
  std::optional<GrammarSpec> grammar;
};

// tool_choice: "auto" (the default), "none", "required" or {"type": "function", "function":
// {"name": ...}} (kFunction, `function` names one of the request's tools).
struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function;
  bool operator==(const ToolChoice&) const = default;
};

struct ChatCompletionRequest {
  std::optional<std::string> model;  // nullopt: the served model
  // Non-empty; roles system/user/assistant/tool (and DeepSeek-V4's latest_reminder); a tool
  // message has a tool_call_id; assistant tool calls are of type "function".
  std::vector<Message> messages;
  GenerationOptions gen;
  std::vector<ToolDefinition> tools;  // names unique, [A-Za-z0-9_-]{1,64}
  ToolChoice tool_choice;             // kRequired / kFunction only with tools
  bool parallel_tool_calls = true;    // false: at most one call is returned
  bool thinking = false;              // chat_template_kwargs.thinking (DeepSeek-V3.1's switch)
  // OpenAI's reasoning_effort (none, minimal, low, medium, high, xhigh) or DeepSeek's max: turns
  // thinking on unless "none" (chat_template_kwargs.thinking, when given, decides); DeepSeek-V4's
  // prompt takes max (and xhigh) as its "max" effort, the rest as "high" (docs/server.md).
  std::optional<std::string> reasoning_effort;
};

struct CompletionRequest {
  std::optional<std::string> model;
  // Text, or token ids (each < vocab_size, non-empty).
  std::variant<std::string, std::vector<int32_t>> prompt;
  GenerationOptions gen;
  // The legacy API's echo: the prompt's text before the completion's (not with logprobs: the
  // engine does not score prompt tokens).
  bool echo = false;
};

// The checks every request body gets before its fields are read: nesting depth, JSON syntax,
// an object at the top, and no object wider than `max_keys` (the APIs that translate into a chat
// request keep the client's key order, which costs time quadratic in an object's width).
std::optional<ApiError> check_request_body(std::string_view body, size_t max_keys);

// What a request's headers add (docs/fault-tolerance.md, "A stream outlives its router"):
// `Idempotency-Key` makes the reply's id and (when the request sets none) its sampling seed
// functions of the key, so that the same request sent again, through any router, is the same
// completion; `Last-Event-ID` resumes a stream after the event with that id (the tokens the
// client has).
struct RequestContext {
  std::optional<std::string> idempotency_key;
  std::optional<int64_t> last_event_id;
};

ApiResult<ChatCompletionRequest> parse_chat_request(std::string_view body,
                                                    const RequestLimits& limits);
ApiResult<CompletionRequest> parse_completion_request(std::string_view body,
                                                      const RequestLimits& limits);

}  // namespace moeserve
