// HttpServer: the HTTP front of an OpenAiService (cpp-httplib, confined to http_server.cpp).
//
// Routes: POST /v1/chat/completions, POST /v1/completions, the Responses API (POST /v1/responses,
// GET and DELETE /v1/responses/<id>, GET /v1/responses/<id>/input_items), Anthropic's Messages
// API (POST /v1/messages[/count_tokens], with errors in Anthropic's shape), GET
// /v1/models[/<id>] (API key required on every /v1 route when one is set, as a bearer token or
// an x-api-key header), GET /health (200 while the engine steps, 503
// when it is dead or the server drains), GET /metrics (Prometheus text). Unknown routes get 404,
// oversized bodies 413, oversized headers 431, all with OpenAI-style error bodies.
//
// Streaming replies are pulled from the service's ReplyStream on the worker thread; when the
// client goes away (a failed write), the stream is abandoned and its engine requests cancelled.
//
// Threading: start() and shutdown() from one controlling thread; requests run on the server's
// own worker pool. The service, engine and metrics must outlive the HttpServer.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "server/metrics.h"
#include "server/reply.h"
#include "server/responses_api.h"

namespace moeserve {

class OpenAiService;

// A route besides the API's (the PD routes of a unit or the router, docs/pd.md): the same
// checks as /v1 (header size, API key, draining), a body in, a Reply out.
struct HttpRoute {
  std::string method;  // "GET" or "POST"
  std::string path;    // exact
  std::function<Reply(std::string_view body)> handler;
  bool while_draining = false;  // still served while the server drains (deregistration)
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                     // 0: any free port (tests)
  std::optional<std::string> api_key;  // required on /v1 routes when set
  size_t max_body_bytes = size_t(8) << 20;
  size_t max_header_bytes = size_t(32) << 10;  // all header names and values together
  int http_threads = 64;                       // connections served at once (each stream holds one)
  double shutdown_timeout_s = 30;              // in-flight requests may finish for this long
  std::chrono::milliseconds stream_poll{50};   // how often an idle stream checks its client
  std::vector<HttpRoute> routes;               // more routes
  std::function<std::string()> extra_metrics;  // appended to GET /metrics
  ResponsesOptions responses;                  // how many, how long responses are kept
};

class HttpServer {
 public:
  HttpServer(OpenAiService& service, Engine& engine, ServerMetrics& metrics,
             HttpServerOptions options);
  ~HttpServer();  // shutdown() if still running

  // Binds and serves on a background thread. Error: the address cannot be bound.
  Status start();
  // The bound port (after start()).
  int port() const;

  // Graceful stop: new requests get 503; requests in flight (the API's, and the calls of
  // `routes` until their streams end: a decode unit's token streams) may finish until
  // shutdown_timeout, then the API's are cancelled (their replies end with finish_reason
  // "abort"); then the listener closes. Idempotent.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve
