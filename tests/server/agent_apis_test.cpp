// The Responses API and Anthropic's Messages API over HTTP, on a FakeEngine that scripts the
// model's tokens: the prompt each request becomes (equal to the chat request it stands for), the
// output items and content blocks (text, reasoning/thinking, tool calls), streamed events against
// the blocking reply, stop reasons, the response store (previous_response_id, GET, DELETE,
// eviction) and errors in each API's shape.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "harness.h"
#include "tool_call_text.h"

namespace moeserve::testing {
namespace {

using json = nlohmann::json;

// The events of an SSE body with named events ("event: <type>\ndata: {...}").
std::vector<std::pair<std::string, json>> named_events(const std::string& body) {
  std::vector<std::pair<std::string, json>> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event at " << pos;
    if (end == std::string::npos) break;
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = ev.find('\n');
    EXPECT_TRUE(ev.starts_with("event: ") && nl != std::string::npos) << ev;
    if (nl == std::string::npos) break;
    EXPECT_EQ(ev.substr(nl + 1, 6), "data: ") << ev;
    json data = json::parse(ev.substr(nl + 7));
    const std::string type = ev.substr(7, nl - 7);
    EXPECT_EQ(data["type"], type) << ev;
    out.emplace_back(type, std::move(data));
  }
  return out;
}

// The prompt of the n-th request the engine was given, as text.
std::string prompt_of(const Harness& h, size_t n) {
  auto sub = h.engine.submitted();
  EXPECT_GT(sub.size(), n);
  return sub.size() > n ? v3_tokenizer().decode(sub[n].prompt, /*skip_special=*/false) : "";
}

ChatTemplate r1_template() {
  return ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekR1, v3_tokenizer().bos_token());
}

const std::string kWeather =
    R"("name":"get_weather","description":"Weather of a city.",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})";
const std::string kCallText = kCallsBegin + call("get_weather", R"({"city": "Paris"})") + kCallsEnd;

// ---- The Responses API ----

TEST(ResponsesApi, TextReplyAndThePromptOfTheSameChatRequest) {
  Harness h(scripted("Hello there."));
  auto chat =
      h.post("/v1/chat/completions", R"({"messages":[{"role":"system","content":"Be brief."},)"
                                     R"({"role":"user","content":"Hi"}],"max_tokens":20})");
  ASSERT_EQ(chat->status, 200) << chat->body;
  auto r = h.post("/v1/responses",
                  R"({"instructions":"Be brief.","input":"Hi","max_output_tokens":20})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(prompt_of(h, 1), prompt_of(h, 0));
  EXPECT_EQ(h.engine.submitted()[1].max_tokens, 20);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["status"], "completed");
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("resp_"));
  EXPECT_EQ(j["instructions"], "Be brief.");
  EXPECT_EQ(j["max_output_tokens"], 20);
  ASSERT_EQ(j["output"].size(), 1u) << j.dump();
  const json& msg = j["output"][0];
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["status"], "completed");
  EXPECT_EQ(msg["content"][0]["type"], "output_text");
  EXPECT_EQ(msg["content"][0]["text"], "Hello there.");
  const json chat_usage = json::parse(chat->body)["usage"];
  EXPECT_EQ(j["usage"]["input_tokens"], chat_usage["prompt_tokens"]);
  EXPECT_EQ(j["usage"]["output_tokens"], chat_usage["completion_tokens"]);
  EXPECT_EQ(j["usage"]["total_tokens"], chat_usage["total_tokens"]);
  EXPECT_EQ(j["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
}

TEST(ResponsesApi, InputItemsBecomeTheChatConversation) {
  Harness h(scripted("ok"));
  // The same conversation as chat messages and as Responses input items (developer = system).
  auto chat =
      h.post("/v1/chat/completions",
             R"({"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"},)"
             R"({"role":"assistant","content":"A1"},{"role":"user","content":"Q2"}]})");
  ASSERT_EQ(chat->status, 200) << chat->body;
  auto r =
      h.post("/v1/responses",
             R"({"input":[{"role":"developer","content":"S"},)"
             R"({"type":"message","role":"user","content":[{"type":"input_text","text":"Q1"}]},)"
             R"({"role":"assistant","content":[{"type":"output_text","text":"A1"}]},)"
             R"({"role":"user","content":"Q2"}]})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(prompt_of(h, 1), prompt_of(h, 0));
}

TEST(ResponsesApi, StreamedEventsSayWhatTheBlockingReplySays) {
  Harness h(scripted("Hello there, friend."));
  const json blocking = json::parse(h.post("/v1/responses", R"({"input":"Hi"})")->body);
  auto r = h.post("/v1/responses", R"({"input":"Hi","stream":true})");
  ASSERT_EQ(r->status, 200);
  const auto events = named_events(r->body);
  ASSERT_GE(events.size(), 8u);
  std::vector<std::string> types;
  std::string text;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].second["sequence_number"], i);
    if (types.empty() || types.back() != events[i].first) types.push_back(events[i].first);
    if (events[i].first == "response.output_text.delta") {
      text += events[i].second["delta"].get<std::string>();
    }
  }
  const std::vector<std::string> want = {
      "response.created",           "response.in_progress",
      "response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.done",
      "response.content_part.done", "response.output_item.done",
      "response.completed"};
  EXPECT_EQ(types, want);
  EXPECT_EQ(events[0].second["response"]["status"], "in_progress");
  EXPECT_EQ(text, "Hello there, friend.");
  json final = events.back().second["response"];
  json expected = blocking;
  for (json* j : {&final, &expected}) {  // ids and times differ between two runs
    j->erase("id");
    j->erase("created_at");
    for (json& item : (*j)["output"]) item.erase("id");
  }
  EXPECT_EQ(final, expected);
}

TEST(ResponsesApi, AToolCallIsAFunctionCallItemAndItsOutputContinuesTheConversation) {
  Harness h(scripted(kCallText));
  auto r = h.post("/v1/responses", R"({"input":"Weather in Paris?","tools":[{"type":"function",)" +
                                       kWeather + R"(}],"tool_choice":"auto"})");
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  ASSERT_EQ(j["output"].size(), 1u) << j.dump();
  const json& fc = j["output"][0];
  EXPECT_EQ(fc["type"], "function_call");
  EXPECT_EQ(fc["name"], "get_weather");
  EXPECT_EQ(fc["arguments"], R"({"city": "Paris"})");
  EXPECT_EQ(fc["status"], "completed");
  EXPECT_EQ(j["tool_choice"], "auto");
  const std::string call_id = fc["call_id"];

  // The round trip: previous_response_id and the call's output give the prompt of the chat
  // request with the whole conversation.
  auto next = h.post("/v1/responses",
                     R"({"previous_response_id":")" + j["id"].get<std::string>() +
                         R"(","input":[{"type":"function_call_output","call_id":")" + call_id +
                         R"(","output":"sunny"}],"tools":[{"type":"function",)" + kWeather + "}]}");
  ASSERT_EQ(next->status, 200) << next->body;
  EXPECT_EQ(json::parse(next->body)["previous_response_id"], j["id"]);
  const std::string chat_tools = R"([{"type":"function","function":{)" + kWeather + "}}]";
  auto chat = h.post(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"Weather in Paris?"},)"
      R"({"role":"assistant","content":null,"tool_calls":[{"id":")" +
          call_id +
          R"(","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},)"
          R"({"role":"tool","tool_call_id":")" +
          call_id + R"(","content":"sunny"}],"tools":)" + chat_tools + "}");
  ASSERT_EQ(chat->status, 200) << chat->body;
  EXPECT_EQ(prompt_of(h, 1), prompt_of(h, 2));

  // The same turn sent explicitly (the call item in the input) is the same prompt.
  auto explicit_turn =
      h.post("/v1/responses", R"({"input":[{"role":"user","content":"Weather in Paris?"},)"
                              R"({"type":"function_call","call_id":")" +
                                  call_id +
                                  R"(","name":"get_weather","arguments":"{\"city\": \"Paris\"}"},)"
                                  R"({"type":"function_call_output","call_id":")" +
                                  call_id + R"(","output":"sunny"}],"tools":[{"type":"function",)" +
                                  kWeather + "}]}");
  ASSERT_EQ(explicit_turn->status, 200) << explicit_turn->body;
  EXPECT_EQ(prompt_of(h, 3), prompt_of(h, 2));
}

TEST(ResponsesApi, StreamedCallArgumentsAddUpToTheItem) {
  Harness h(scripted(kCallText));
  auto r =
      h.post("/v1/responses", R"({"input":"Weather?","stream":true,"tools":[{"type":"function",)" +
                                  kWeather + "}]}");
  ASSERT_EQ(r->status, 200);
  std::string args, done;
  json item;
  for (const auto& [type, e] : named_events(r->body)) {
    if (type == "response.function_call_arguments.delta") args += e["delta"].get<std::string>();
    if (type == "response.function_call_arguments.done") done = e["arguments"];
    if (type == "response.completed") item = e["response"]["output"].back();
  }
  EXPECT_EQ(args, R"({"city": "Paris"})");
  EXPECT_EQ(done, args);
  EXPECT_EQ(item["type"], "function_call");
  EXPECT_EQ(item["arguments"], args);
}

TEST(ResponsesApi, ReasoningIsAnItemBeforeTheMessage) {
  Harness h(scripted("Let me see.</think>\n\nIt is 4."), {}, {}, r1_template());
  auto r = h.post("/v1/responses", R"({"input":"2+2?"})");
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  ASSERT_EQ(j["output"].size(), 2u) << j.dump();
  EXPECT_EQ(j["output"][0]["type"], "reasoning");
  EXPECT_EQ(j["output"][0]["content"][0]["type"], "reasoning_text");
  EXPECT_EQ(j["output"][0]["content"][0]["text"], "Let me see.");
  EXPECT_EQ(j["output"][1]["content"][0]["text"], "\n\nIt is 4.");
  const int64_t reasoning = j["usage"]["output_tokens_details"]["reasoning_tokens"];
  const int64_t all = j["usage"]["output_tokens"];
  // "Let me see." and "</think>": the tokens up to the end of the block.
  const int64_t want = int64_t(v3_tokenizer().encode("Let me see.</think>", false).size());
  EXPECT_EQ(reasoning, want);
  EXPECT_LT(reasoning, all);

  auto s = h.post("/v1/responses", R"({"input":"2+2?","stream":true})");
  std::string streamed;
  for (const auto& [type, e] : named_events(s->body)) {
    if (type == "response.reasoning_text.delta") streamed += e["delta"].get<std::string>();
  }
  EXPECT_EQ(streamed, "Let me see.");
}

TEST(ResponsesApi, MaxOutputTokensMakesAnIncompleteResponse) {
  Harness h(scripted("one two three four five six seven", /*with_eos=*/false));
  const json j =
      json::parse(h.post("/v1/responses", R"({"input":"count","max_output_tokens":3})")->body);
  EXPECT_EQ(j["status"], "incomplete");
  EXPECT_EQ(j["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(j["usage"]["output_tokens"], 3);
  EXPECT_EQ(j["output"][0]["status"], "incomplete");
  auto s = h.post("/v1/responses", R"({"input":"count","max_output_tokens":3,"stream":true})");
  EXPECT_EQ(named_events(s->body).back().first, "response.incomplete");
}

TEST(ResponsesApi, StoredResponsesAreRetrievedDeletedAndEvicted) {
  HttpServerOptions ho;
  ho.responses.max_stored = 2;
  Harness h(scripted("ok"), ho);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(json::parse(h.post("/v1/responses", R"({"input":"Hi"})")->body)["id"]);
  }
  EXPECT_EQ(h.get("/v1/responses/" + ids[0])->status, 404);  // the oldest, pushed out
  auto got = h.get("/v1/responses/" + ids[2]);
  ASSERT_EQ(got->status, 200);
  EXPECT_EQ(json::parse(got->body)["id"], ids[2]);
  const json items = json::parse(h.get("/v1/responses/" + ids[2] + "/input_items")->body);
  EXPECT_EQ(items["data"][0]["content"][0]["text"], "Hi");
  EXPECT_EQ(h.client()->Delete("/v1/responses/" + ids[2])->status, 200);
  EXPECT_EQ(h.get("/v1/responses/" + ids[2])->status, 404);
  // store: false keeps nothing.
  const std::string unstored =
      json::parse(h.post("/v1/responses", R"({"input":"Hi","store":false})")->body)["id"];
  EXPECT_EQ(h.get("/v1/responses/" + unstored)->status, 404);
  auto cont =
      h.post("/v1/responses", R"({"input":"again","previous_response_id":")" + unstored + R"("})");
  EXPECT_EQ(cont->status, 400);
  EXPECT_EQ(json::parse(cont->body)["error"]["code"], "previous_response_not_found");
}

TEST(ResponsesApi, WhatItCannotDoIsA400NamingTheField) {
  Harness h(scripted("ok"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({})", "input"},
      {R"({"input":[]})", "input"},
      {R"({"input":5})", "input"},
      {R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]})",
       "input[0].content[0].type"},
      {R"({"input":[{"type":"web_search_call"}]})", "input[0].type"},
      {R"({"input":"x","tools":[{"type":"web_search"}]})", "tools[0].type"},
      {R"({"input":"x","background":true})", "background"},
      {R"({"input":"x","temperature":5})", "temperature"},
      {R"({"input":"x","text":{"format":{"type":"xml"}}})", "text.format.type"},
      {R"({"input":"x","tool_choice":{"type":"function"}})", "tool_choice"},
  };
  for (const auto& [body, param] : cases) {
    auto r = h.post("/v1/responses", body);
    ASSERT_EQ(r->status, 400) << body << " -> " << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["param"], param) << body << " -> " << r->body;
  }
}

// ---- Anthropic's Messages API ----

TEST(MessagesApi, TextReplyUsageAndThePromptOfTheSameChatRequest) {
  Harness h(scripted("Hello there."));
  auto chat =
      h.post("/v1/chat/completions", R"({"messages":[{"role":"system","content":"Be brief."},)"
                                     R"({"role":"user","content":"Hi"}],"max_tokens":20})");
  auto r =
      h.post("/v1/messages",
             R"({"model":"moeserve","max_tokens":20,"system":[{"type":"text","text":"Be brief."}],)"
             R"("messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(prompt_of(h, 1), prompt_of(h, 0));
  const json j = json::parse(r->body);
  EXPECT_EQ(j["type"], "message");
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("msg_"));
  ASSERT_EQ(j["content"].size(), 1u);
  EXPECT_EQ(j["content"][0], json({{"type", "text"}, {"text", "Hello there."}}));
  EXPECT_EQ(j["stop_reason"], "end_turn");
  EXPECT_TRUE(j["stop_sequence"].is_null());
  const json u = j["usage"];
  EXPECT_EQ(u["input_tokens"].get<int64_t>() + u["cache_read_input_tokens"].get<int64_t>(),
            json::parse(chat->body)["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(u["output_tokens"], json::parse(chat->body)["usage"]["completion_tokens"]);

  auto count =
      h.post("/v1/messages/count_tokens", R"({"model":"moeserve","system":"Be brief.",)"
                                          R"("messages":[{"role":"user","content":"Hi"}]})");
  ASSERT_EQ(count->status, 200) << count->body;
  EXPECT_EQ(json::parse(count->body)["input_tokens"],
            int64_t(h.engine.submitted()[1].prompt.size()));
}

TEST(MessagesApi, StopSequencesAndMaxTokens) {
  Harness h(scripted("Hello wonderful world", /*with_eos=*/false));
  json j =
      json::parse(h.post("/v1/messages",
                         R"({"model":"moeserve","max_tokens":20,"stop_sequences":["xyz"," wor"],)"
                         R"("messages":[{"role":"user","content":"Hi"}]})")
                      ->body);
  EXPECT_EQ(j["content"][0]["text"], "Hello wonderful");
  EXPECT_EQ(j["stop_reason"], "stop_sequence");
  EXPECT_EQ(j["stop_sequence"], " wor");
  j = json::parse(
      h.post("/v1/messages",
             R"({"model":"moeserve","max_tokens":2,"messages":[{"role":"user","content":"Hi"}]})")
          ->body);
  EXPECT_EQ(j["stop_reason"], "max_tokens");
  EXPECT_EQ(j["usage"]["output_tokens"], 2);
}

TEST(MessagesApi, ToolUseBlocksStreamedAndNotAndTheToolResultRoundTrip) {
  Harness h(scripted("Let me check." + kCallText));
  const std::string tools =
      R"("tools":[{"name":"get_weather","description":"Weather of a city.",)"
      R"("input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}])";
  const std::string req = R"({"model":"moeserve","max_tokens":64,)" + tools +
                          R"(,"messages":[{"role":"user","content":"Weather in Paris?"}])";
  const json j = json::parse(h.post("/v1/messages", req + "}")->body);
  ASSERT_EQ(j["content"].size(), 2u) << j.dump();
  EXPECT_EQ(j["content"][0]["text"], "Let me check.");
  const json& use = j["content"][1];
  EXPECT_EQ(use["type"], "tool_use");
  EXPECT_TRUE(use["id"].get<std::string>().starts_with("toolu_"));
  EXPECT_EQ(use["name"], "get_weather");
  EXPECT_EQ(use["input"], json({{"city", "Paris"}}));
  EXPECT_EQ(j["stop_reason"], "tool_use");

  auto s = h.post("/v1/messages", req + R"(,"stream":true})");
  const auto events = named_events(s->body);
  ASSERT_GE(events.size(), 6u);
  EXPECT_EQ(events.front().first, "message_start");
  EXPECT_EQ(events.front().second["message"]["content"], json::array());
  EXPECT_EQ(events.back().first, "message_stop");
  json blocks = json::array();
  std::string partial_json;
  json delta;
  for (const auto& [type, e] : events) {
    if (type == "content_block_start") {
      EXPECT_EQ(e["index"], blocks.size());
      blocks.push_back(e["content_block"]);
    } else if (type == "content_block_delta") {
      EXPECT_EQ(e["index"], blocks.size() - 1);
      const json& d = e["delta"];
      if (d["type"] == "text_delta")
        blocks.back()["text"] =
            blocks.back()["text"].get<std::string>() + d["text"].get<std::string>();
      if (d["type"] == "input_json_delta") partial_json += d["partial_json"].get<std::string>();
    } else if (type == "message_delta") {
      delta = e;
    }
  }
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0]["text"], "Let me check.");
  EXPECT_EQ(blocks[1]["name"], "get_weather");
  EXPECT_EQ(json::parse(partial_json), use["input"]);
  EXPECT_EQ(delta["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(delta["usage"]["output_tokens"], j["usage"]["output_tokens"]);

  // The round trip is the chat request with the call and its result.
  const std::string id = use["id"];
  auto round =
      h.post("/v1/messages",
             R"({"model":"moeserve","max_tokens":8,)" + tools +
                 R"(,"messages":[{"role":"user","content":"Weather in Paris?"},)"
                 R"({"role":"assistant","content":[{"type":"text","text":"Let me check."},)"
                 R"({"type":"tool_use","id":")" +
                 id +
                 R"(","name":"get_weather","input":{"city":"Paris"}}]},)"
                 R"({"role":"user","content":[{"type":"tool_result","tool_use_id":")" +
                 id + R"(","content":[{"type":"text","text":"sunny"}]}]}]})");
  ASSERT_EQ(round->status, 200) << round->body;
  auto chat = h.post(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"Weather in Paris?"},)"
      R"({"role":"assistant","content":"Let me check.","tool_calls":[{"id":")" +
          id +
          R"(","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},)"
          R"({"role":"tool","tool_call_id":")" +
          id +
          R"(","content":"sunny"}],"tools":[{"type":"function","function":{"name":"get_weather",)"
          R"("description":"Weather of a city.","parameters":{"type":"object","properties":)"
          R"({"city":{"type":"string"}},"required":["city"]}}}]})");
  ASSERT_EQ(chat->status, 200) << chat->body;
  EXPECT_EQ(prompt_of(h, 2), prompt_of(h, 3));
}

TEST(MessagesApi, ACallWhoseArgumentsAreNotJsonComesBackAsText) {
  Harness h(scripted(kCallsBegin + call("get_weather", "city=Paris") + kCallsEnd));
  const json j = json::parse(
      h.post("/v1/messages",
             R"({"model":"moeserve","max_tokens":64,"tools":[{"name":"get_weather",)"
             R"("input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"w"}]})")
          ->body);
  ASSERT_EQ(j["content"].size(), 1u) << j.dump();
  EXPECT_EQ(j["content"][0]["type"], "text");
  EXPECT_EQ(j["content"][0]["text"], "get_weathercity=Paris");
  EXPECT_EQ(j["stop_reason"], "end_turn");
}

TEST(MessagesApi, ThinkingBlocksComeFirst) {
  Harness h(scripted("Let me see.</think>\n\nIt is 4."), {}, {}, r1_template());
  const json j = json::parse(
      h.post(
           "/v1/messages",
           R"({"model":"moeserve","max_tokens":64,"messages":[{"role":"user","content":"2+2?"}]})")
          ->body);
  ASSERT_EQ(j["content"].size(), 2u) << j.dump();
  EXPECT_EQ(j["content"][0]["type"], "thinking");
  EXPECT_EQ(j["content"][0]["thinking"], "Let me see.");
  EXPECT_TRUE(j["content"][0]["signature"].is_string());
  EXPECT_EQ(j["content"][1]["text"], "\n\nIt is 4.");
  auto s = h.post("/v1/messages", R"({"model":"moeserve","max_tokens":64,"stream":true,)"
                                  R"("messages":[{"role":"user","content":"2+2?"}]})");
  std::string thinking;
  for (const auto& [type, e] : named_events(s->body)) {
    if (type == "content_block_delta" && e["delta"]["type"] == "thinking_delta") {
      thinking += e["delta"]["thinking"].get<std::string>();
    }
  }
  EXPECT_EQ(thinking, "Let me see.");
}

void expect_anthropic_error(const httplib::Result& r, int status, const std::string& type) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, status) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  EXPECT_EQ(j["type"], "error") << r->body;
  EXPECT_EQ(j["error"]["type"], type) << r->body;
  EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
}

TEST(MessagesApi, ErrorsComeInAnthropicsShape) {
  HttpServerOptions ho;
  ho.api_key = "k";
  Harness h(scripted("ok"), ho);
  const std::string hi = R"("messages":[{"role":"user","content":"Hi"}])";
  httplib::Headers key = {{"x-api-key", "k"}};
  expect_anthropic_error(h.post("/v1/messages", R"({"model":"moeserve",)" + hi + "}", key), 400,
                         "invalid_request_error");  // no max_tokens
  expect_anthropic_error(
      h.post("/v1/messages", R"({"model":"moeserve","max_tokens":4,"temperature":1.5,)" + hi + "}",
             key),
      400, "invalid_request_error");
  expect_anthropic_error(
      h.post("/v1/messages", R"({"model":"other","max_tokens":4,)" + hi + "}", key), 404,
      "not_found_error");
  expect_anthropic_error(h.post("/v1/messages", R"({"model":"moeserve","max_tokens":4,)" + hi + "}",
                                {{"x-api-key", "wrong"}}),
                         401, "authentication_error");
  expect_anthropic_error(h.post("/v1/messages/nope", "{}", key), 404, "not_found_error");
  expect_anthropic_error(
      h.post("/v1/messages",
             R"({"model":"moeserve","max_tokens":4,"messages":[{"role":"user","content":)"
             R"([{"type":"image","source":{}}]}]})",
             key),
      400, "invalid_request_error");
  auto ok = h.post("/v1/messages", R"({"model":"moeserve","max_tokens":4,)" + hi + "}", key);
  EXPECT_EQ(ok->status, 200) << ok->body;
  // The OpenAI routes take the Anthropic client's header too, and keep their own error shape.
  EXPECT_EQ(h.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Hi"}]})", key)
                ->status,
            200);
}

}  // namespace
}  // namespace moeserve::testing
