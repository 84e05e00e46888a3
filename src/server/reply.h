// Reply and ReplyStream: what an HTTP handler returns, independent of the HTTP library: a
// complete body, or an SSE stream the HTTP layer (server/http_server.h) pulls chunk by chunk.
// The OpenAI endpoints (server/openai_service.h), the PD routes of a unit and the router
// (router/pd_http.h, router/pd_unit.h) all answer with them.
//
// A ReplyStream is used by one thread at a time; whatever it reads from must outlive it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace moeserve {

// An SSE body produced as it is generated.
class ReplyStream {
 public:
  virtual ~ReplyStream() = default;
  // Appends the next SSE events to `out`, waiting up to `wait` for output when there is
  // nothing to send yet. Returns false once the stream is complete (after "data: [DONE]").
  virtual bool next(std::string& out, std::chrono::milliseconds wait) = 0;
  // The client went away: cancels what produces the stream.
  virtual void abandon() = 0;
};

struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::shared_ptr<ReplyStream> stream;  // set for an SSE reply (then body is empty)
};

}  // namespace moeserve
