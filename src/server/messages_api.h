// MessagesApi: Anthropic's Messages API, as DeepSeek's own API offers it beside OpenAI's, over
// the chat core of OpenAiService (docs/server.md, "The Anthropic Messages API"). POST
// /v1/messages translates the request (system, text / tool_use / tool_result / thinking blocks,
// tools with input_schema, tool_choice, thinking, stop_sequences) into a chat request, starts it
// with OpenAiService::start_chat, and answers with a Message, or streams Anthropic's events
// (message_start ... message_stop). POST /v1/messages/count_tokens counts a request's input.
// Errors come in Anthropic's shape ({"type": "error", "error": {"type", "message"}}).
//
// Threading: every method may be called from any HTTP worker thread. The service must outlive
// the MessagesApi and every Reply it returned.
#pragma once

#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/reply.h"

namespace moeserve {

class OpenAiService;

class MessagesApi {
 public:
  explicit MessagesApi(OpenAiService& service) : service_(service) {}

  Reply create(std::string_view body);
  Reply count_tokens(std::string_view body);

 private:
  OpenAiService& service_;
};

// An error as Anthropic's API writes it (the type follows the HTTP status).
std::string anthropic_error_body(const ApiError& e);

}  // namespace moeserve
