#include "server/http_server.h"

#include <atomic>
#include <charconv>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

#include "server/api_error.h"
#include "server/auth.h"
#include "server/chat_page.h"
#include "server/messages_api.h"
#include "server/openai_service.h"
#include "server/responses_api.h"

namespace moeserve {

namespace {

ApiError make_error(int status, std::string message, std::string type,
                    std::optional<std::string> code = std::nullopt) {
  ApiError e;
  e.http_status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

// The API whose shape an error takes: Anthropic's on /v1/messages, OpenAI's elsewhere.
enum class ErrorShape { kOpenAi, kAnthropic };

ErrorShape shape_of(const std::string& path) {
  return path.starts_with("/v1/messages") ? ErrorShape::kAnthropic : ErrorShape::kOpenAi;
}

void send_error(httplib::Response& res, const ApiError& e, ErrorShape shape = ErrorShape::kOpenAi) {
  res.status = e.http_status;
  res.set_content(shape == ErrorShape::kAnthropic ? anthropic_error_body(e) : e.to_json(),
                  "application/json");
}

// The Idempotency-Key and Last-Event-ID headers (docs/fault-tolerance.md).
ApiResult<RequestContext> request_context(const httplib::Request& req) {
  RequestContext ctx;
  if (req.has_header("Idempotency-Key")) {
    std::string key = req.get_header_value("Idempotency-Key");
    if (key.empty() || key.size() > 255) {
      return bad_request("the Idempotency-Key header must be 1 to 255 bytes", "Idempotency-Key");
    }
    ctx.idempotency_key = std::move(key);
  }
  if (req.has_header("Last-Event-ID")) {
    const std::string v = req.get_header_value("Last-Event-ID");
    int64_t id = -1;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), id);
    if (ec != std::errc() || end != v.data() + v.size() || id < 0) {
      return bad_request(
          "the Last-Event-ID header must be the id of an event of the stream (an "
          "integer >= 0)",
          "Last-Event-ID");
    }
    ctx.last_event_id = id;
  }
  return ctx;
}

size_t header_bytes(const httplib::Request& req) {
  size_t n = 0;
  for (const auto& [k, v] : req.headers) n += k.size() + v.size() + 4;  // ": " and CRLF
  return n;
}

}  // namespace

struct HttpServer::Impl {
  Impl(OpenAiService& service, Engine& engine, ServerMetrics& metrics, HttpServerOptions options)
      : service(service),
        engine(engine),
        metrics(metrics),
        options(std::move(options)),
        responses(service, this->options.responses),
        messages(service) {}

  OpenAiService& service;
  Engine& engine;
  ServerMetrics& metrics;
  const HttpServerOptions options;
  ResponsesApi responses;
  MessagesApi messages;
  httplib::Server svr;
  std::thread listener;
  int port = 0;
  std::atomic<bool> draining{false};
  // Calls of options.routes not finished yet, streams until their last byte (or their client's
  // departure): shutdown() waits for them as for the API's requests.
  std::atomic<int64_t> routes_in_flight{0};
  bool stopped = false;  // only the controlling thread touches it

  // The checks every route shares; false when `res` already holds the refusal.
  bool admit(const httplib::Request& req, httplib::Response& res, bool v1,
             bool while_draining = false) {
    const ErrorShape shape = shape_of(req.path);
    if (header_bytes(req) > options.max_header_bytes) {
      send_error(
          res,
          make_error(431, fmt::format("request headers exceed {} bytes", options.max_header_bytes),
                     "invalid_request_error", "header_too_large"),
          shape);
      return false;
    }
    // The key as OpenAI's clients send it, or as Anthropic's do (x-api-key).
    if (v1 && options.api_key &&
        !bearer_matches(req.get_header_value("Authorization"), *options.api_key) &&
        !(req.has_header("x-api-key") &&
          constant_time_equal(req.get_header_value("x-api-key"), *options.api_key))) {
      send_error(res,
                 make_error(401,
                            "missing or invalid API key (send Authorization: Bearer KEY or "
                            "x-api-key: KEY)",
                            "authentication_error", "invalid_api_key"),
                 shape);
      return false;
    }
    if (v1 && !while_draining && draining.load()) {
      send_error(
          res,
          make_error(503, "the server is shutting down", "service_unavailable", "shutting_down"),
          shape);
      return false;
    }
    return true;
  }

  // counted: the reply of a route call, which gives its routes_in_flight back once sent.
  void send(httplib::Response& res, Reply reply, bool counted = false) {
    res.status = reply.status;
    if (!reply.stream) {
      res.set_content(std::move(reply.body), reply.content_type);
      if (counted) --routes_in_flight;
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    std::shared_ptr<ReplyStream> stream = std::move(reply.stream);
    const std::chrono::milliseconds poll = options.stream_poll;
    res.set_chunked_content_provider(
        reply.content_type,
        [stream, poll](size_t /*offset*/, httplib::DataSink& sink) {
          std::string out;
          const bool more = stream->next(out, poll);
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            stream->abandon();  // the client went away
            return false;
          }
          if (!more) {
            sink.done();
          } else if (out.empty() && !sink.is_writable()) {
            stream->abandon();
            return false;
          }
          return true;
        },
        // (httplib calls this once, when the response ends or is dropped unsent.)
        [this, stream, counted](bool success) {
          if (!success) stream->abandon();
          if (counted) --routes_in_flight;
        });
  }

  void routes() {
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      if (!admit(req, res, true)) return;
      ApiResult<RequestContext> ctx = request_context(req);
      send(res, ctx.ok() ? service.chat_completions(req.body, *ctx) : error_reply(ctx.error()));
    });
    svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      if (!admit(req, res, true)) return;
      ApiResult<RequestContext> ctx = request_context(req);
      send(res, ctx.ok() ? service.completions(req.body, *ctx) : error_reply(ctx.error()));
    });
    svr.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
      if (admit(req, res, true)) send(res, responses.create(req.body));
    });
    svr.Get(R"(/v1/responses/([^/]+))",
            [this](const httplib::Request& req, httplib::Response& res) {
              if (admit(req, res, true)) send(res, responses.retrieve(std::string(req.matches[1])));
            });
    svr.Get(R"(/v1/responses/([^/]+)/input_items)",
            [this](const httplib::Request& req, httplib::Response& res) {
              if (admit(req, res, true)) {
                send(res, responses.input_items(std::string(req.matches[1])));
              }
            });
    svr.Delete(R"(/v1/responses/([^/]+))",
               [this](const httplib::Request& req, httplib::Response& res) {
                 if (admit(req, res, true))
                   send(res, responses.remove(std::string(req.matches[1])));
               });
    svr.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
      if (admit(req, res, true)) send(res, messages.create(req.body));
    });
    svr.Post("/v1/messages/count_tokens",
             [this](const httplib::Request& req, httplib::Response& res) {
               if (admit(req, res, true)) send(res, messages.count_tokens(req.body));
             });
    svr.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (admit(req, res, true)) send(res, service.models());
    });
    svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (!admit(req, res, true)) return;
      if (req.matches[1] != service.served_model_name()) {
        send_error(res, make_error(404,
                                   fmt::format("The model '{}' does not exist.",
                                               std::string(req.matches[1])),
                                   "invalid_request_error", "model_not_found"));
        return;
      }
      send(res, service.models());
    });
    // The chat page (docs/server.md "The web page"): self-contained, and the policy keeps it
    // so: scripts, styles and requests from this origin only. The API key, when the server
    // has one, is typed into the page; the page itself is public, as /health is.
    svr.Get("/", [this](const httplib::Request& req, httplib::Response& res) {
      if (!admit(req, res, false)) return;
      res.set_header("Content-Security-Policy",
                     "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                     "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                     "form-action 'none'");
      res.set_header("Cache-Control", "no-cache");
      res.set_content(std::string(chat_page_html()), "text/html; charset=utf-8");
    });
    svr.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
      if (!admit(req, res, false)) return;
      if (!engine.healthy()) {
        Status why = engine.failure();
        send_error(res, make_error(503,
                                   why.ok() ? std::string("the engine has stopped")
                                            : "the engine has stopped: " + why.message(),
                                   "service_unavailable", "engine_dead"));
      } else if (draining.load()) {
        send_error(res, make_error(503, "the server is shutting down", "service_unavailable",
                                   "shutting_down"));
      } else {
        res.set_content("{\"status\":\"ok\"}", "application/json");
      }
    });
    svr.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
      if (!admit(req, res, false)) return;
      std::string text = metrics.render(engine.stats());
      if (options.extra_metrics) text += options.extra_metrics();
      res.set_content(std::move(text), "text/plain; version=0.0.4");
    });
    for (const HttpRoute& r : options.routes) {
      auto handler = [this, &r](const httplib::Request& req, httplib::Response& res) {
        if (!admit(req, res, true, r.while_draining)) return;
        ++routes_in_flight;
        send(res, r.handler(req.body), /*counted=*/true);
      };
      if (r.method == "GET") {
        svr.Get(r.path, handler);
      } else {
        svr.Post(r.path, handler);
      }
    }
    // Replies that httplib itself produced (404 for unknown routes, 413, bad request lines) get
    // an OpenAI-style body too. Replies with a body already are left alone.
    svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string msg;
      switch (res.status) {
        case 404:
          msg = fmt::format("no route for {} {}", req.method, req.path);
          break;
        case 413:
          msg = "the request body is too large";
          break;
        case 414:
          msg = "the request URI is too long";
          break;
        default:
          msg = fmt::format("HTTP {}", res.status);
          break;
      }
      ApiError e = make_error(res.status, msg,
                              res.status >= 500 ? "internal_error" : "invalid_request_error");
      send_error(res, e, shape_of(req.path));
    });
    svr.set_exception_handler(
        [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unknown exception";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          send_error(res, make_error(500, "internal error: " + what, "internal_error"),
                     shape_of(req.path));
        });
    // API replies by status (scrapes of /metrics and /health are not counted).
    svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      if (req.path.rfind("/v1/", 0) == 0) metrics.count_reply(res.status);
    });
  }
};

HttpServer::HttpServer(OpenAiService& service, Engine& engine, ServerMetrics& metrics,
                       HttpServerOptions options)
    : impl_(std::make_unique<Impl>(service, engine, metrics, std::move(options))) {}

HttpServer::~HttpServer() {
  shutdown();
}

Status HttpServer::start() {
  Impl& m = *impl_;
  const int threads = std::max(2, m.options.http_threads);
  m.svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  m.svr.set_payload_max_length(m.options.max_body_bytes);
  m.svr.set_read_timeout(30, 0);
  m.svr.set_write_timeout(30, 0);
  m.routes();
  if (m.options.port == 0) {
    m.port = m.svr.bind_to_any_port(m.options.host);
    if (m.port < 0) m.port = 0;
  } else if (m.svr.bind_to_port(m.options.host, m.options.port)) {
    m.port = m.options.port;
  }
  if (m.port <= 0) {
    return Unavailable(fmt::format("cannot listen on {}:{} (address in use or not available)",
                                   m.options.host, m.options.port));
  }
  m.listener = std::thread([&m] { m.svr.listen_after_bind(); });
  return Status::Ok();
}

int HttpServer::port() const {
  return impl_->port;
}

void HttpServer::shutdown() {
  Impl& m = *impl_;
  if (m.stopped || !m.listener.joinable()) return;
  m.stopped = true;
  m.draining = true;
  using Clock = std::chrono::steady_clock;
  auto busy = [&] { return m.service.in_flight() > 0 || m.routes_in_flight.load() > 0; };
  auto wait_idle = [&](Clock::time_point deadline) {
    while (busy() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  wait_idle(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(m.options.shutdown_timeout_s)));
  if (busy()) {
    m.service.cancel_all();
    // Cancelled requests end within an engine step; their streams then send [DONE].
    wait_idle(Clock::now() + std::chrono::seconds(10));
  }
  m.svr.stop();
  m.listener.join();
}

}  // namespace moeserve
