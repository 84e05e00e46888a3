// A server on a free local port over a FakeEngine, with helpers to send raw HTTP and read SSE
// bodies. Test-only.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "fake_engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::testing {

inline const Tokenizer& v3_tokenizer() {
  static const Tokenizer tok = [] {
    auto t = Tokenizer::load("assets/tokenizer/deepseek-v3");
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::move(t).value();
  }();
  return tok;
}

// An engine that generates `text` (its tokens, one a step), then EOS.
inline FakeEngineOptions scripted(const std::string& text, bool with_eos = true) {
  FakeEngineOptions o;
  o.script = v3_tokenizer().encode(text, false);
  if (with_eos) {
    o.eos = *v3_tokenizer().eos_id();
    o.script.push_back(*o.eos);
  }
  return o;
}

struct Harness {
  explicit Harness(FakeEngineOptions eo = {}, HttpServerOptions ho = {}, ServiceOptions so = {},
                   std::optional<ChatTemplate> tmpl = std::nullopt)
      : engine(std::move(eo)),
        service(engine, v3_tokenizer(),
                tmpl ? *tmpl : ChatTemplate::for_tokenizer(v3_tokenizer()).value(), so, metrics),
        http(service, engine, metrics, with_free_port(std::move(ho))) {
    Status s = http.start();
    EXPECT_TRUE(s.ok()) << s.to_string();
  }

  static HttpServerOptions with_free_port(HttpServerOptions o) {
    o.host = "127.0.0.1";
    o.port = 0;
    return o;
  }

  std::unique_ptr<httplib::Client> client() {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", http.port());
    c->set_read_timeout(30, 0);
    return c;
  }

  httplib::Result post(const std::string& path, const std::string& body,
                       httplib::Headers headers = {}) {
    return client()->Post(path.c_str(), headers, body, "application/json");
  }
  httplib::Result get(const std::string& path, httplib::Headers headers = {}) {
    return client()->Get(path.c_str(), headers);
  }

  FakeEngine engine;
  ServerMetrics metrics;
  OpenAiService service;
  HttpServer http;
};

// The JSON payloads of an SSE body ("data: {...}\n\n" events); "[DONE]" becomes the string.
inline std::vector<nlohmann::json> sse_events(const std::string& body) {
  std::vector<nlohmann::json> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event at " << pos;
    if (end == std::string::npos) break;
    std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.starts_with("id: ")) ev = ev.substr(ev.find('\n') + 1);  // (sse_ids reads them)
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    std::string data = ev.substr(6);
    out.push_back(data == "[DONE]" ? nlohmann::json("[DONE]") : nlohmann::json::parse(data));
  }
  return out;
}

// The ids of an SSE body's events, in order (-1 for an event without one).
inline std::vector<int64_t> sse_ids(const std::string& body) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    out.push_back(ev.starts_with("id: ") ? std::stoll(ev.substr(4)) : -1);
  }
  return out;
}

}  // namespace moeserve::testing
