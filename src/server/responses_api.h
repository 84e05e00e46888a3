// ResponsesApi: OpenAI's Responses API over the chat core of OpenAiService (docs/server.md,
// "The Responses API"). POST /v1/responses translates the request (input items, instructions,
// flat function tools, text.format, reasoning.effort) into a chat request, starts it with
// OpenAiService::start_chat, and answers with a Response object, or streams Response events
// (response.created ... response.completed). Responses are kept for `previous_response_id`,
// GET /v1/responses/{id}, /v1/responses/{id}/input_items and DELETE: the newest `max_stored`,
// each for `retention`.
//
// Threading: every method may be called from any HTTP worker thread. The service must outlive
// the ResponsesApi and every Reply it returned.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string_view>

#include "server/reply.h"

namespace moeserve {

class OpenAiService;

struct ResponsesOptions {
  size_t max_stored = 1024;              // responses kept (oldest dropped first)
  std::chrono::seconds retention{3600};  // how long one is kept
};

class ResponsesApi {
 public:
  ResponsesApi(OpenAiService& service, ResponsesOptions options = {});
  ~ResponsesApi();

  Reply create(std::string_view body);
  Reply retrieve(std::string_view id) const;
  Reply input_items(std::string_view id) const;
  Reply remove(std::string_view id);

  class Store;

 private:
  OpenAiService& service_;
  std::shared_ptr<Store> store_;  // shared with streams that store when they end
};

}  // namespace moeserve
