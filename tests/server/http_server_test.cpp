// The HTTP server end to end over a FakeEngine: response shapes, SSE streaming, stop strings,
// logprobs, usage, every error path (status code and OpenAI error body), API keys, limits,
// client disconnects (-> engine cancel), metrics text, graceful shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "harness.h"

namespace moeserve::testing {
namespace {

using json = nlohmann::json;

const std::string kHello = R"({"messages":[{"role":"user","content":"Hi"}]})";

std::string many_words(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += " w" + std::to_string(i);
  return s;
}

void expect_error(const httplib::Result& r, int status, const std::string& type = "",
                  const std::string& param = "") {
  ASSERT_TRUE(r) << "no reply";
  EXPECT_EQ(r->status, status) << r->body;
  json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r->body;
  EXPECT_TRUE(e.contains("type") && e.contains("param") && e.contains("code")) << r->body;
  if (!type.empty()) {
    EXPECT_EQ(e["type"], type) << r->body;
  }
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << r->body;
  }
}

TEST(HttpServer, ChatCompletionNonStreaming) {
  Harness h(scripted("Hello there, friend."));
  auto r = h.post("/v1/chat/completions",
                  R"({"model":"moeserve","messages":[{"role":"system","content":"Be kind."},
                      {"role":"user","content":"Hi"}],"temperature":0,"seed":7})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["model"], "moeserve");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello there, friend.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(j["choices"][0]["message"].contains("reasoning_content"));  // V3 template
  // The prompt is the template's rendering, tokenized.
  auto sub = h.engine.submitted();
  ASSERT_EQ(sub.size(), 1u);
  std::vector<Message> msgs(2);
  msgs[0].role = "system";
  msgs[0].content = "Be kind.";
  msgs[1].role = "user";
  msgs[1].content = "Hi";
  auto text = ChatTemplate::for_tokenizer(v3_tokenizer())->render(msgs, true);
  EXPECT_EQ(sub[0].prompt, v3_tokenizer().encode(*text, false));
  EXPECT_EQ(sub[0].seed, 7u);
  EXPECT_EQ(sub[0].sampling.temperature, 0.0f);
  EXPECT_EQ(sub[0].max_tokens, h.engine.max_context() - int64_t(sub[0].prompt.size()));
  EXPECT_EQ(j["usage"]["prompt_tokens"], sub[0].prompt.size());
  const size_t generated = scripted("Hello there, friend.").script.size();  // with EOS
  EXPECT_EQ(j["usage"]["completion_tokens"], generated);
  EXPECT_EQ(j["usage"]["total_tokens"], sub[0].prompt.size() + generated);
}

TEST(HttpServer, MaxTokensGivesLength) {
  Harness h(scripted("one two three four five six seven"));
  auto r = h.post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"count"}],"max_tokens":3})");
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "one two three");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
}

TEST(HttpServer, ChatStreamingChunksAndUsage) {
  Harness h(scripted("Streaming works, 世界!"));
  auto r = h.post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"Hi"}],"stream":true,
                      "stream_options":{"include_usage":true}})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/event-stream", 0), 0u);
  auto events = sse_events(r->body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  // First chunk: the assistant role.
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string finish;
  const std::string id = events[0]["id"];
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json& e = events[i];
    EXPECT_EQ(e["id"], id);
    EXPECT_TRUE(e.contains("usage") && e["usage"].is_null());
    ASSERT_EQ(e["choices"].size(), 1u);
    const json& c = e["choices"][0];
    EXPECT_TRUE(finish.empty()) << "chunk after the finish";
    if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(text, "Streaming works, 世界!");
  EXPECT_EQ(finish, "stop");
  // The usage chunk: no choices.
  const json& u = events[events.size() - 2];
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["completion_tokens"], scripted("Streaming works, 世界!").script.size());
  EXPECT_EQ(u["usage"]["prompt_tokens"], h.engine.submitted()[0].prompt.size());
}

TEST(HttpServer, StreamWithoutUsageHasNoUsageField) {
  Harness h(scripted("abc"));
  auto r = h.post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"Hi"}],"stream":true})");
  ASSERT_EQ(r->status, 200);
  auto events = sse_events(r->body);
  for (size_t i = 0; i + 1 < events.size(); ++i) EXPECT_FALSE(events[i].contains("usage"));
  EXPECT_EQ(events.back(), "[DONE]");
}

TEST(HttpServer, StopStringAcrossTokensIsCutAndCancelsTheRequest) {
  const std::string text = "The answer is forty-two, said the machine, and then went on.";
  FakeEngineOptions o = scripted(text, /*with_eos=*/false);
  const std::string stop = "forty-two";
  for (int32_t id : o.script) {
    ASSERT_EQ(v3_tokenizer().decode(std::vector<int32_t>{id}, true).find(stop), std::string::npos);
  }
  o.step_delay = std::chrono::milliseconds(2);
  Harness h(o);
  for (bool stream : {false, true}) {
    json body = {{"messages", {{{"role", "user"}, {"content", "?"}}}},
                 {"stop", {"never-seen", stop}},
                 {"stream", stream},
                 {"max_tokens", 200},
                 {"ignore_eos", true}};
    auto r = h.post("/v1/chat/completions", body.dump());
    ASSERT_EQ(r->status, 200) << r->body;
    std::string content, finish, id;
    if (stream) {
      for (const json& e : sse_events(r->body)) {
        if (e == "[DONE]") continue;
        id = e["id"];
        const json& c = e["choices"][0];
        if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
        if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      }
    } else {
      json j = json::parse(r->body);
      id = j["id"];
      content = j["choices"][0]["message"]["content"];
      finish = j["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(content, "The answer is ");
    EXPECT_EQ(finish, "stop");
    EXPECT_TRUE(FakeEngine::eventually([&] { return h.engine.was_cancelled(id + "-0"); }));
  }
}

TEST(HttpServer, NChoicesWithSeedsAndLogprobs) {
  Harness h(scripted("x y z"));
  auto r = h.post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"Hi"}],"n":3,"seed":10,
                      "logprobs":true,"top_logprobs":2})");
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const json& c = j["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["message"]["content"], "x y z");
    const json& lp = c["logprobs"]["content"];
    ASSERT_EQ(lp.size(), 4u);  // x, " y", " z", EOS
    EXPECT_EQ(lp[0]["token"], "x");
    EXPECT_EQ(lp[0]["bytes"], json::array({int('x')}));
    EXPECT_FLOAT_EQ(lp[0]["logprob"].get<float>(), -0.25f);
    ASSERT_EQ(lp[0]["top_logprobs"].size(), 2u);
    EXPECT_EQ(lp[0]["top_logprobs"][0]["token"], "x");
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  std::set<uint64_t> seeds;
  for (const auto& s : h.engine.submitted()) {
    seeds.insert(*s.seed);
    EXPECT_EQ(s.top_logprobs, 2);
  }
  EXPECT_EQ(seeds, (std::set<uint64_t>{10, 11, 12}));
}

TEST(HttpServer, StreamingNChoicesKeepTheirIndexes) {
  Harness h(scripted("a b"));
  auto r = h.post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"Hi"}],"n":2,"stream":true})");
  ASSERT_EQ(r->status, 200);
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  for (const json& e : sse_events(r->body)) {
    if (e == "[DONE]") continue;
    const json& c = e["choices"][0];
    int i = c["index"];
    if (c["delta"].contains("content")) text[i] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish[i] = c["finish_reason"];
  }
  EXPECT_EQ(text[0], "a b");
  EXPECT_EQ(text[1], "a b");
  EXPECT_EQ(finish[0], "stop");
  EXPECT_EQ(finish[1], "stop");
}

TEST(HttpServer, CompletionsWithTextAndTokenPrompts) {
  Harness h(scripted(" world"));
  auto r = h.post("/v1/completions", R"({"prompt":"Hello","max_tokens":5,"logprobs":1})");
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["text"], " world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 2u);
  EXPECT_EQ(lp["tokens"][0], " world");
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 1u);
  EXPECT_EQ(h.engine.submitted()[0].prompt,
            v3_tokenizer().encode("Hello", v3_tokenizer().default_add_bos()));
  EXPECT_EQ(h.engine.submitted()[0].max_tokens, 5);

  r = h.post("/v1/completions", R"({"prompt":[[5, 6, 7]],"stream":true,"max_tokens":1})");
  ASSERT_EQ(r->status, 200) << r->body;
  auto events = sse_events(r->body);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(events[0]["object"], "text_completion");
  EXPECT_EQ(events[0]["choices"][0]["text"], " world");
  EXPECT_EQ(h.engine.submitted()[1].prompt, (std::vector<int32_t>{5, 6, 7}));
}

// echo: the prompt's text before each choice's (a text prompt as sent, token ids decoded),
// streamed as the first event of each choice.
TEST(HttpServer, CompletionsEchoThePrompt) {
  Harness h(scripted(" world"));
  auto r = h.post("/v1/completions", R"({"prompt":"Hello","max_tokens":5,"echo":true,"n":2})");
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"], "Hello world");
  EXPECT_EQ(j["choices"][1]["text"], "Hello world");
  const std::vector<int32_t> ids = v3_tokenizer().encode("Hi there", false);
  r = h.post("/v1/completions",
             json({{"prompt", ids}, {"echo", true}, {"stream", true}, {"max_tokens", 5}}).dump());
  ASSERT_EQ(r->status, 200) << r->body;
  std::string text;
  for (const json& e : sse_events(r->body)) {
    if (e != "[DONE]") text += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "Hi there world");
  EXPECT_EQ(sse_events(r->body)[0]["choices"][0]["text"], "Hi there");
  r = h.post("/v1/completions", R"({"prompt":"Hello","echo":true,"logprobs":1})");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "echo");
}

TEST(HttpServer, ModelsHealthAndUnknownRoutes) {
  Harness h;
  auto r = h.get("/v1/models");
  ASSERT_EQ(r->status, 200);
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "moeserve");
  EXPECT_EQ(j["data"][0]["max_model_len"], 1024);
  EXPECT_EQ(h.get("/v1/models/moeserve")->status, 200);
  expect_error(h.get("/v1/models/other"), 404);
  EXPECT_EQ(h.get("/health")->status, 200);
  h.engine.set_healthy(false);
  expect_error(h.get("/health"), 503);
  expect_error(h.get("/nope"), 404);
  expect_error(h.post("/v1/embeddings", "{}"), 404);
}

TEST(HttpServer, ValidationErrorsAre400WithOpenAIBodies) {
  FakeEngineOptions o;
  o.max_context = 64;
  ServiceOptions so;
  so.limits.max_n = 4;
  so.limits.max_top_logprobs = 5;
  Harness h(o, {}, so);
  struct Case {
    std::string path, body, param;
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", ""},
      {"/v1/chat/completions", "", ""},
      {"/v1/chat/completions", "[]", ""},
      {"/v1/chat/completions", R"({"messages":[]})", "messages"},
      {"/v1/chat/completions", R"({"messages":[{"role":"robot","content":"x"}]})",
       "messages[0].role"},
      {"/v1/chat/completions", R"({"messages":"hi"})", "messages"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"5"})",
       "max_tokens"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":9})",
       "temperature"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"n":5})", "n"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":6})",
       "top_logprobs"},
      // The prompt fits, but not with max_tokens.
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":62})",
       "max_completion_tokens"},
      // The prompt alone is beyond the context.
      {"/v1/chat/completions",
       json({{"messages", {{{"role", "user"}, {"content", many_words(80)}}}}}).dump(), "messages"},
      {"/v1/completions", R"({"prompt":[1,2,3],"max_tokens":62})", "max_tokens"},
      {"/v1/completions", R"({"prompt":[129280]})", "prompt"},
      {"/v1/completions", R"({"prompt":null})", "prompt"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 120));
    auto r = h.post(c.path, c.body);
    expect_error(r, 400, "invalid_request_error", c.param);
  }
  // None of them reached the engine.
  EXPECT_TRUE(h.engine.submitted().empty());
  // A model that is not served.
  expect_error(h.post("/v1/chat/completions",
                      R"({"model":"gpt-4","messages":[{"role":"user","content":"x"}]})"),
               404, "invalid_request_error", "model");
}

TEST(HttpServer, EngineRefusalsMapTo429And503) {
  Harness h;
  h.engine.set_submit_error(ResourceExhausted("too many queued requests"));
  auto r = h.post("/v1/chat/completions", kHello);
  expect_error(r, 429, "rate_limit_error");
  EXPECT_NE(r->body.find("too many queued requests"), std::string::npos);
  h.engine.set_submit_error(Unavailable("the engine has stopped"));
  expect_error(h.post("/v1/completions", R"({"prompt":"x"})"), 503);
  h.engine.set_submit_error(Status::Ok());
  EXPECT_EQ(h.post("/v1/completions", R"({"prompt":"x","max_tokens":2})")->status, 200);
}

TEST(HttpServer, BodyAndHeaderLimits) {
  HttpServerOptions ho;
  ho.max_body_bytes = 4096;
  ho.max_header_bytes = 2048;
  Harness h({}, ho);
  std::string big = json({{"prompt", std::string(5000, 'a')}}).dump();
  expect_error(h.post("/v1/completions", big), 413);
  httplib::Headers headers = {{"X-Big", std::string(3000, 'h')}};
  expect_error(h.post("/v1/completions", R"({"prompt":"x","max_tokens":1})", headers), 431);
  // A header line longer than the HTTP library's own limit: refused, never a crash or a 5xx.
  httplib::Headers huge = {{"X-Huge", std::string(20000, 'h')}};
  auto r = h.post("/v1/completions", R"({"prompt":"x","max_tokens":1})", huge);
  if (r) {
    EXPECT_GE(r->status, 400);
    EXPECT_LT(r->status, 500);
  }
  // The server still works.
  EXPECT_EQ(h.post("/v1/completions", R"({"prompt":"x","max_tokens":1})")->status, 200);
}

TEST(HttpServer, ApiKeyGuardsEveryV1Route) {
  HttpServerOptions ho;
  ho.api_key = "s3cret-key";
  Harness h({}, ho);
  const httplib::Headers good = {{"Authorization", "Bearer s3cret-key"}};
  const std::vector<httplib::Headers> bad = {{},
                                             {{"Authorization", "Bearer s3cret-kex"}},
                                             {{"Authorization", "Bearer s3cret-key2"}},
                                             {{"Authorization", "s3cret-key"}},
                                             {{"Authorization", "Basic s3cret-key"}},
                                             {{"Authorization", "Bearer "}}};
  for (const auto& hdr : bad) {
    expect_error(h.post("/v1/chat/completions", kHello, hdr), 401, "authentication_error");
    expect_error(h.post("/v1/completions", R"({"prompt":"x"})", hdr), 401);
    expect_error(h.get("/v1/models", hdr), 401);
    expect_error(h.get("/v1/models/moeserve", hdr), 401);
  }
  EXPECT_TRUE(h.engine.submitted().empty());
  EXPECT_EQ(h.post("/v1/completions", R"({"prompt":"x","max_tokens":1})", good)->status, 200);
  EXPECT_EQ(h.get("/v1/models", good)->status, 200);
  EXPECT_EQ(h.get("/health")->status, 200);  // not a /v1 route
  EXPECT_EQ(h.get("/metrics")->status, 200);
}

TEST(HttpServer, ClientDisconnectMidStreamCancelsTheRequest) {
  FakeEngineOptions o;
  o.step_delay = std::chrono::milliseconds(5);
  Harness h(o);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = R"({"messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":900,
                 "ignore_eos":true})";
  req.set_header("Content-Type", "application/json");
  std::string received;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    received.append(data, n);
    return received.find("\"content\":\"") == std::string::npos ||
           received.find("chatcmpl") == std::string::npos || received.size() < 600;
  };
  auto c = h.client();
  auto r = c->send(req);  // the receiver returning false closes the connection
  EXPECT_FALSE(r);
  size_t p = received.find("\"id\":\"");
  ASSERT_NE(p, std::string::npos) << received;
  std::string id = received.substr(p + 6, received.find('"', p + 6) - p - 6);
  EXPECT_TRUE(FakeEngine::eventually([&] { return h.engine.was_cancelled(id + "-0"); }))
      << "no cancel for " << id;
  EXPECT_TRUE(FakeEngine::eventually([&] { return h.engine.live() == 0; }));
  EXPECT_TRUE(FakeEngine::eventually([&] { return h.service.in_flight() == 0; }));
  EXPECT_NE(h.metrics.render(h.engine.stats())
                .find("moeserve_request_finished_total{finish_reason=\"abort\"} 1\n"),
            std::string::npos);
}

// A chat stream's role chunk goes out with the first token, not before the prefill: clients that
// time the first chunk (vLLM's `bench serve`) then measure the time to the first token, as
// against vLLM's own server. With 100 ms to the first token, the first bytes the client gets
// hold the role chunk and the first text together.
TEST(HttpServer, TheRoleChunkComesWithTheFirstToken) {
  FakeEngineOptions o = scripted("Hello there.");
  o.step_delay = std::chrono::milliseconds(100);
  Harness h(o);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = R"({"messages":[{"role":"user","content":"Hi"}],"stream":true})";
  req.set_header("Content-Type", "application/json");
  std::string received, first;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (received.empty()) first.assign(data, n);
    received.append(data, n);
    return true;
  };
  auto r = h.client()->send(req);
  ASSERT_TRUE(r);
  EXPECT_NE(first.find("\"role\":\"assistant\""), std::string::npos) << first;
  EXPECT_NE(first.find("\"content\":\"Hello"), std::string::npos)
      << "the role chunk came alone, before the first token: " << first;
  EXPECT_NE(received.find("data: [DONE]"), std::string::npos) << received;
}

TEST(HttpServer, MetricsTextFormat) {
  Harness h(scripted("a b c"));
  ASSERT_EQ(h.post("/v1/chat/completions", kHello)->status, 200);
  ASSERT_EQ(h.post("/v1/chat/completions",
                   R"({"messages":[{"role":"user","content":"x"}],"stream":true})")
                ->status,
            200);
  expect_error(h.post("/v1/chat/completions", "{"), 400);
  // Replies are counted once written, which may be just after the client has read them.
  std::optional<httplib::Result> r;
  EXPECT_TRUE(FakeEngine::eventually([&] {
    r = h.get("/metrics");
    return *r &&
           (*r)->body.find("moeserve_http_requests_total{status=\"200\"} 2\n") !=
               std::string::npos &&
           (*r)->body.find("moeserve_http_requests_total{status=\"400\"} 1\n") != std::string::npos;
  }));
  ASSERT_TRUE(*r);
  ASSERT_EQ((*r)->status, 200);
  EXPECT_EQ((*r)->get_header_value("Content-Type").rfind("text/plain", 0), 0u);
  const std::string& t = (*r)->body;
  const std::regex sample(R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_]+="[^"]*"\})? -?[0-9.e+-]+$)");
  const std::regex comment(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$)");
  std::istringstream in(t);
  std::map<std::string, std::string> values;
  for (std::string line; std::getline(in, line);) {
    EXPECT_TRUE(std::regex_match(line, sample) || std::regex_match(line, comment)) << line;
    if (line[0] != '#') values[line.substr(0, line.rfind(' '))] = line.substr(line.rfind(' ') + 1);
  }
  EXPECT_EQ(values["moeserve_http_requests_total{status=\"200\"}"], "2");
  EXPECT_EQ(values["moeserve_http_requests_total{status=\"400\"}"], "1");
  EXPECT_EQ(values["moeserve_request_finished_total{finish_reason=\"stop\"}"], "2");
  EXPECT_EQ(values["moeserve_generation_tokens_total"], "8");
  for (const char* name :
       {"moeserve_prompt_tokens_total", "moeserve_prefix_cache_queries_total",
        "moeserve_prefix_cache_hits_total", "moeserve_num_requests_running",
        "moeserve_num_requests_waiting", "moeserve_kv_blocks_used", "moeserve_kv_blocks_total"}) {
    EXPECT_TRUE(values.count(name)) << name;
  }
  EXPECT_EQ(values["moeserve_kv_blocks_total"], "100");
  for (const char* h_name :
       {"moeserve_time_to_first_token_seconds", "moeserve_inter_token_latency_seconds",
        "moeserve_e2e_request_latency_seconds"}) {
    std::string name = h_name;
    EXPECT_NE(t.find("# TYPE " + name + " histogram"), std::string::npos) << name;
    // Buckets are cumulative and +Inf equals _count.
    std::regex bucket(name + R"re(_bucket\{le="([^"]+)"\} ([0-9]+))re");
    int64_t prev = 0;
    for (std::sregex_iterator it(t.begin(), t.end(), bucket), end; it != end; ++it) {
      int64_t v = std::stoll((*it)[2]);
      EXPECT_GE(v, prev) << name;
      prev = v;
    }
    EXPECT_EQ(std::to_string(prev), values[name + "_count"]) << name;
  }
  EXPECT_EQ(values["moeserve_time_to_first_token_seconds_count"], "2");
  EXPECT_EQ(values["moeserve_inter_token_latency_seconds_count"], "6");
  EXPECT_EQ(values["moeserve_e2e_request_latency_seconds_count"], "2");
}

TEST(HttpServer, ShutdownLetsInFlightRequestsFinish) {
  FakeEngineOptions o = scripted("a b c d e f g h", false);
  o.step_delay = std::chrono::milliseconds(10);
  HttpServerOptions ho;
  ho.shutdown_timeout_s = 30;
  Harness h(o, ho);
  std::optional<httplib::Result> result;
  std::thread client([&] {
    result = h.post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"x"}],"stream":true,"max_tokens":8})");
  });
  ASSERT_TRUE(FakeEngine::eventually([&] { return h.engine.live() == 1; }));
  std::thread stopper([&] { h.http.shutdown(); });
  client.join();
  stopper.join();
  ASSERT_TRUE(*result);
  EXPECT_EQ((*result)->status, 200);
  auto events = sse_events((*result)->body);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(h.get("/health"));  // the listener is closed
}

TEST(HttpServer, ShutdownPastTheDeadlineCancelsAndRefusesNewRequests) {
  FakeEngineOptions o;
  o.step_delay = std::chrono::milliseconds(5);
  HttpServerOptions ho;
  ho.shutdown_timeout_s = 0.3;
  Harness h(o, ho);
  std::optional<httplib::Result> result;
  std::thread client([&] {
    result = h.post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1000,
                        "ignore_eos":true})");
  });
  ASSERT_TRUE(FakeEngine::eventually([&] { return h.engine.live() == 1; }));
  std::thread stopper([&] { h.http.shutdown(); });
  // While draining, new generation requests are refused.
  bool saw_503 = FakeEngine::eventually(
      [&] {
        auto r = h.post("/v1/completions", R"({"prompt":"x","max_tokens":1})");
        return r && r->status == 503;
      },
      std::chrono::seconds(5));
  client.join();
  stopper.join();
  EXPECT_TRUE(saw_503);
  ASSERT_TRUE(*result);
  ASSERT_EQ((*result)->status, 200) << (*result)->body;
  EXPECT_EQ(json::parse((*result)->body)["choices"][0]["finish_reason"], "abort");
  EXPECT_EQ(h.engine.live(), 0);
}

}  // namespace
}  // namespace moeserve::testing

namespace moeserve::testing {
namespace {

TEST(HttpServer, R1ReasoningGoesToReasoningContent) {
  // The later R1 template opens <think> in the prompt; the model's output closes it.
  FakeEngineOptions o = scripted("Let me see.</think>\n\nIt is 4.");
  Harness h(
      o, {}, {},
      ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekR1, v3_tokenizer().bos_token()));
  auto r = h.post("/v1/chat/completions", kHello);
  ASSERT_EQ(r->status, 200) << r->body;
  json m = json::parse(r->body)["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "Let me see.");
  EXPECT_EQ(m["content"], "\n\nIt is 4.");

  r = h.post("/v1/chat/completions",
             R"({"messages":[{"role":"user","content":"Hi"}],"stream":true})");
  ASSERT_EQ(r->status, 200);
  std::string reasoning, content;
  for (const json& e : sse_events(r->body)) {
    if (e == "[DONE]") continue;
    const json& d = e["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "Let me see.");
  EXPECT_EQ(content, "\n\nIt is 4.");
}

TEST(HttpServer, DeadEngineEndsRequestsWith503) {
  FakeEngineOptions o;
  o.step_delay = std::chrono::milliseconds(2);
  Harness h(o);
  h.engine.set_paused(true);  // requests are accepted but get no output
  std::optional<httplib::Result> result;
  std::thread client([&] {
    result = h.post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"x"}],"max_tokens":5})");
  });
  ASSERT_TRUE(FakeEngine::eventually([&] { return h.engine.live() == 1; }));
  h.engine.set_healthy(false);
  client.join();
  ASSERT_TRUE(*result);
  EXPECT_EQ((*result)->status, 503) << (*result)->body;
  expect_error(h.get("/health"), 503);
}

}  // namespace
}  // namespace moeserve::testing
