// Request parsing and validation: every rejected input gives a 400 with a message and (where a
// field is at fault) the field's name as `param`; good inputs fill the typed structs.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_request.h"

namespace moeserve {
namespace {

RequestLimits limits() {
  RequestLimits l;
  l.vocab_size = 1000;
  l.max_context = 512;
  l.max_n = 4;
  l.max_top_logprobs = 5;
  l.max_stop_strings = 3;
  l.max_stop_bytes = 8;
  return l;
}

const std::string kMsgs = R"("messages":[{"role":"user","content":"hi"}])";
const std::string kTwoTools =
    R"(, "tools": [{"type":"function","function":{"name":"f","description":"F.",
        "parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}},
        {"type":"function","function":{"name":"g-2"}}])";

struct BadCase {
  std::string body;
  std::string param;  // "" when no field is named
};

TEST(ParseChat, RejectsBadInputWith400AndTheField) {
  const std::vector<BadCase> cases = {
      {"", ""},
      {"{", ""},
      {"[1,2]", ""},
      {"\"text\"", ""},
      {"{\"messages\": [{\"role\":\"user\",\"content\":\"\xff\"}]}", ""},  // invalid UTF-8
      {std::string(100, '[') + std::string(100, ']'), ""},                 // nesting
      {"{}", "messages"},
      {R"({"messages": null})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [1]})", "messages"},
      {R"({"messages": [{"content":"hi"}]})", "messages"},
      {R"({"messages": [{"role":"wizard","content":"hi"}]})", "messages[0].role"},
      {R"({"messages": [{"role":"user"}]})", "messages[0].content"},
      {R"({"messages": [{"role":"user","content":null}]})", "messages[0].content"},
      {R"({"messages": [{"role":"user","content":5}]})", "messages"},
      {R"({"messages": [{"role":"user","content":[{"type":"image_url"}]}]})", "messages"},
      {R"({"messages": [{"role":"assistant"}]})", "messages[0].content"},
      {R"({"model": 5, )" + kMsgs + "}", "model"},
      {"{" + kMsgs + R"(, "max_tokens": 0})", "max_tokens"},
      {"{" + kMsgs + R"(, "max_tokens": -5})", "max_tokens"},
      {"{" + kMsgs + R"(, "max_tokens": "10"})", "max_tokens"},
      {"{" + kMsgs + R"(, "max_tokens": 1.5})", "max_tokens"},
      {"{" + kMsgs + R"(, "max_tokens": 1e400})", ""},  // the JSON parser refuses it
      {"{" + kMsgs + R"(, "max_tokens": 99999999999999999999999})", "max_tokens"},
      {"{" + kMsgs + R"(, "max_completion_tokens": 0})", "max_completion_tokens"},
      {"{" + kMsgs + R"(, "temperature": -0.1})", "temperature"},
      {"{" + kMsgs + R"(, "temperature": 2.5})", "temperature"},
      {"{" + kMsgs + R"(, "temperature": "hot"})", "temperature"},
      {"{" + kMsgs + R"(, "top_p": 0})", "top_p"},
      {"{" + kMsgs + R"(, "top_p": 1.01})", "top_p"},
      {"{" + kMsgs + R"(, "top_k": -2})", "top_k"},
      {"{" + kMsgs + R"(, "seed": "x"})", "seed"},
      {"{" + kMsgs + R"(, "seed": 1.5})", "seed"},
      {"{" + kMsgs + R"(, "n": 0})", "n"},
      {"{" + kMsgs + R"(, "n": 5})", "n"},
      {"{" + kMsgs + R"(, "n": true})", "n"},
      {"{" + kMsgs + R"(, "best_of": 3})", "best_of"},
      {"{" + kMsgs + R"(, "logprobs": 1})", "logprobs"},
      {"{" + kMsgs + R"(, "top_logprobs": 2})", "top_logprobs"},
      {"{" + kMsgs + R"(, "logprobs": true, "top_logprobs": 6})", "top_logprobs"},
      {"{" + kMsgs + R"(, "logprobs": true, "top_logprobs": -1})", "top_logprobs"},
      {"{" + kMsgs + R"(, "stop": 5})", "stop"},
      {"{" + kMsgs + R"(, "stop": [""]})", "stop"},
      {"{" + kMsgs + R"(, "stop": ["a", 1]})", "stop"},
      {"{" + kMsgs + R"(, "stop": ["a","b","c","d"]})", "stop"},
      {"{" + kMsgs + R"(, "stop": "123456789"})", "stop"},
      {"{" + kMsgs + R"(, "stop_token_ids": [1000]})", "stop_token_ids"},
      {"{" + kMsgs + R"(, "stop_token_ids": [-1]})", "stop_token_ids"},
      {"{" + kMsgs + R"(, "stream": "yes"})", "stream"},
      {"{" + kMsgs + R"(, "stream_options": {"include_usage": true}})", "stream_options"},
      {"{" + kMsgs + R"(, "stream": true, "stream_options": 1})", "stream_options"},
      {"{" + kMsgs + R"(, "stream": true, "stream_options": {"include_usage": 1}})",
       "stream_options.include_usage"},
      {"{" + kMsgs + R"(, "ignore_eos": 1})", "ignore_eos"},
      {"{" + kMsgs + R"(, "presence_penalty": 2.5})", "presence_penalty"},
      {"{" + kMsgs + R"(, "frequency_penalty": "x"})", "frequency_penalty"},
      {"{" + kMsgs + R"(, "frequency_penalty": -2.01})", "frequency_penalty"},
      {"{" + kMsgs + R"(, "repetition_penalty": 0})", "repetition_penalty"},
      {"{" + kMsgs + R"(, "min_p": 1.5})", "min_p"},
      {"{" + kMsgs + R"(, "logit_bias": {"5": 101}})", "logit_bias"},
      {"{" + kMsgs + R"(, "logit_bias": {"x": 1}})", "logit_bias"},
      {"{" + kMsgs + R"(, "logit_bias": {"1000": 1}})", "logit_bias"},  // the vocabulary: 1000
      {"{" + kMsgs + R"(, "logit_bias": {"-1": 1}})", "logit_bias"},
      {"{" + kMsgs + R"(, "logit_bias": {"5": 1, "05": 2}})", "logit_bias"},
      {"{" + kMsgs + R"(, "logit_bias": {"5": "1"}})", "logit_bias.5"},
      {"{" + kMsgs + R"(, "logit_bias": [1]})", "logit_bias"},
      {"{" + kMsgs + R"(, "tools": [{"type":"function"}]})", "tools[0].function"},
      {"{" + kMsgs + R"(, "tools": {"type":"function"}})", "tools"},
      {"{" + kMsgs + R"(, "tools": [5]})", "tools[0]"},
      {"{" + kMsgs + R"(, "tools": [{"type":"code","function":{"name":"f"}}]})", "tools[0].type"},
      {"{" + kMsgs + R"(, "tools": [{"function":{"name":"f"}}]})", "tools[0].type"},
      {"{" + kMsgs + R"(, "tools": [{"type":"function","function":{}}]})",
       "tools[0].function.name"},
      {"{" + kMsgs + R"(, "tools": [{"type":"function","function":{"name":"a b"}}]})",
       "tools[0].function.name"},
      {"{" + kMsgs + R"(, "tools": [{"type":"function","function":{"name":""}}]})",
       "tools[0].function.name"},
      {"{" + kMsgs + R"(, "tools": [{"type":"function","function":{"name":")" +
           std::string(65, 'x') + R"("}}]})",
       "tools[0].function.name"},
      {"{" + kMsgs + kTwoTools.substr(0, kTwoTools.size() - 1) +
           R"(,{"type":"function","function":{"name":"f"}}]})",
       "tools[2].function.name"},  // a duplicate name
      {"{" + kMsgs +
           R"(, "tools": [{"type":"function","function":{"name":"f","parameters":"{}"}}]})",
       "tools[0].function.parameters"},
      {"{" + kMsgs + R"(, "tools": [{"type":"function","function":{"name":"f","description":1}}]})",
       "tools[0].function.description"},
      {"{" + kMsgs + R"(, "tools": [{"type":"function","function":{"name":"f","strict":"y"}}]})",
       "tools[0].function.strict"},
      {"{" + kMsgs + kTwoTools + R"(, "tool_choice": "any"})", "tool_choice"},
      {"{" + kMsgs + kTwoTools + R"(, "tool_choice": 1})", "tool_choice"},
      {"{" + kMsgs + kTwoTools + R"(, "tool_choice": {"type":"function","function":{"name":"h"}}})",
       "tool_choice"},
      {"{" + kMsgs + kTwoTools + R"(, "tool_choice": {"type":"function"}})", "tool_choice"},
      {"{" + kMsgs + kTwoTools + R"(, "tool_choice": {"function":{"name":"f"}}})", "tool_choice"},
      {"{" + kMsgs + R"(, "tool_choice": "required"})", "tool_choice"},
      {"{" + kMsgs + R"(, "tool_choice": {"type":"function","function":{"name":"f"}}})",
       "tool_choice"},
      {"{" + kMsgs + kTwoTools + R"(, "parallel_tool_calls": "no"})", "parallel_tool_calls"},
      {R"({"messages":[{"role":"tool","content":"42"}]})", "messages[0].tool_call_id"},
      {R"({"messages":[{"role":"tool","content":"42","tool_call_id":""}]})",
       "messages[0].tool_call_id"},
      {R"({"messages":[{"role":"tool","content":"42","tool_call_id":7}]})",
       "messages[0].tool_call_id"},
      {R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"code",
          "function":{"name":"f","arguments":"{}"}}]}]})",
       "messages[0].tool_calls[0].type"},
      {R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"function",
          "function":{"name":"f","arguments":5}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"function",
          "function":{"name":"f"}}]}]})",
       "messages"},
      {"{" + kMsgs + R"(, "response_format": "json"})", "response_format"},
      {"{" + kMsgs + R"(, "response_format": {}})", "response_format.type"},
      {"{" + kMsgs + R"(, "response_format": {"type":"xml"}})", "response_format.type"},
      {"{" + kMsgs + R"(, "response_format": {"type":"json_schema"}})",
       "response_format.json_schema"},
      {"{" + kMsgs + R"(, "response_format": {"type":"json_schema","json_schema":{"schema":5}}})",
       "response_format.json_schema.schema"},
      {"{" + kMsgs +
           R"(, "response_format": {"type":"json_schema","json_schema":{"schema":false}}})",
       "response_format.json_schema.schema"},
      {"{" + kMsgs +
           R"(, "response_format": {"type":"json_schema","json_schema":{"strict":"yes"}}})",
       "response_format.json_schema.strict"},
      {"{" + kMsgs + R"(, "response_format": {"type":"json_schema","json_schema":{"name":"a b"}}})",
       "response_format.json_schema.name"},
      {"{" + kMsgs + R"(, "response_format": {"type":"json_object"}, "ignore_eos": true})",
       "ignore_eos"},
  };
  for (const BadCase& c : cases) {
    ApiResult<ChatCompletionRequest> r = parse_chat_request(c.body, limits());
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.error().http_status, 400) << c.body;
    EXPECT_FALSE(r.error().message.empty()) << c.body;
    EXPECT_EQ(r.error().param.value_or(""), c.param) << c.body << " -> " << r.error().message;
    auto j = nlohmann::json::parse(r.error().to_json());  // the body is well-formed JSON
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
}

TEST(ParseChat, ResponseFormatsBecomeGrammars) {
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  auto text = parse_chat_request("{" + msgs + R"(, "response_format": {"type":"text"}})", limits());
  ASSERT_TRUE(text.ok());
  EXPECT_FALSE(text->gen.grammar);
  auto object =
      parse_chat_request("{" + msgs + R"(, "response_format": {"type":"json_object"}})", limits());
  ASSERT_TRUE(object.ok());
  ASSERT_TRUE(object->gen.grammar);
  EXPECT_EQ(object->gen.grammar->kind, GrammarSpec::Kind::kJsonObject);
  auto schema = parse_chat_request("{" + msgs + R"(, "response_format": {"type":"json_schema",
      "json_schema":{"name":"person_v2","strict":true,"schema":{"type":"object",
      "properties":{"a":{"type":"integer"}}}}}})",
                                   limits());
  ASSERT_TRUE(schema.ok()) << schema.error().message;
  ASSERT_TRUE(schema->gen.grammar);
  EXPECT_EQ(schema->gen.grammar->kind, GrammarSpec::Kind::kJsonSchema);
  EXPECT_TRUE(schema->gen.grammar->strict);
  EXPECT_EQ(nlohmann::json::parse(schema->gen.grammar->schema),
            nlohmann::json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}}})"));
  EXPECT_FALSE(schema->gen.grammar->start_after);
  // No schema (or `true`): any JSON object.
  auto any = parse_chat_request(
      "{" + msgs + R"(, "response_format": {"type":"json_schema","json_schema":{"name":"x"}}})",
      limits());
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->gen.grammar->kind, GrammarSpec::Kind::kJsonObject);
}

TEST(ParseChat, FillsTheTypedRequest) {
  auto r = parse_chat_request(
      R"({"model":"m","messages":[{"role":"developer","content":"be brief"},
          {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
          {"role":"assistant","content":null,"tool_calls":[{"type":"function",
            "function":{"name":"f","arguments":"{}"}}]},
          {"role":"tool","content":"42","tool_call_id":"c1"}],
          "max_tokens": 20, "max_completion_tokens": 30, "temperature": 0, "top_p": 0.5,
          "seed": -1, "stop": "x", "n": 2, "logprobs": true, "top_logprobs": 3,
          "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
          "presence_penalty": 0, "tools": [], "unknown_field": {"kept": "ignored"}})",
      limits());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->model, "m");
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "ab");
  EXPECT_FALSE(r->messages[2].content.has_value());
  EXPECT_EQ(r->gen.max_tokens, 30);  // max_completion_tokens wins
  EXPECT_EQ(r->gen.temperature, 0.0f);
  EXPECT_EQ(r->gen.top_p, 0.5f);
  EXPECT_EQ(r->gen.seed, ~uint64_t(0));
  EXPECT_EQ(r->gen.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r->gen.n, 2);
  EXPECT_TRUE(r->gen.logprobs);
  EXPECT_EQ(r->gen.top_logprobs, 3);
  EXPECT_TRUE(r->gen.stream);
  EXPECT_TRUE(r->gen.include_usage);
  EXPECT_TRUE(r->gen.ignore_eos);
  EXPECT_EQ(r->gen.presence_penalty, 0.0f);
  EXPECT_TRUE(r->gen.logit_bias.empty());
}

TEST(ParseChat, PenaltiesMinPAndLogitBias) {
  auto r = parse_chat_request("{" + kMsgs + R"(, "presence_penalty": -1.5, "frequency_penalty": 2,
      "repetition_penalty": 1.15, "min_p": 0.05, "logit_bias": {"999": -100, "7": 2.5, "0": 100}})",
                              limits());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->gen.presence_penalty, -1.5f);
  EXPECT_EQ(r->gen.frequency_penalty, 2.0f);
  EXPECT_EQ(r->gen.repetition_penalty, 1.15f);
  EXPECT_EQ(r->gen.min_p, 0.05f);
  const std::vector<std::pair<int32_t, float>> bias = {{0, 100.0f}, {7, 2.5f}, {999, -100.0f}};
  EXPECT_EQ(r->gen.logit_bias, bias);  // in id order
  auto c = parse_completion_request(R"({"prompt": "x", "logit_bias": {"3": 1}, "min_p": 0.5})",
                                    limits());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->gen.logit_bias.size(), 1u);
  EXPECT_EQ(c->gen.min_p, 0.5f);
}

TEST(ParseChat, ToolsToolChoiceAndParallelToolCalls) {
  auto r = parse_chat_request("{" + kMsgs + kTwoTools +
                                  R"(, "tool_choice": {"type":"function","function":{"name":"g-2"}},
                                  "parallel_tool_calls": false})",
                              limits());
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->tools.size(), 2u);
  EXPECT_EQ(r->tools[0].name, "f");
  // The client's key order (name before description before parameters), Python's separators.
  EXPECT_EQ(r->tools[0].json,
            R"({"type": "function", "function": {"name": "f", "description": "F.", )"
            R"("parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}})");
  EXPECT_EQ(r->tools[1].json, R"({"type": "function", "function": {"name": "g-2"}})");
  EXPECT_EQ(r->tool_choice, (ToolChoice{ToolChoice::Mode::kFunction, "g-2"}));
  EXPECT_FALSE(r->parallel_tool_calls);
  for (auto [text, mode] : {std::pair{"auto", ToolChoice::Mode::kAuto},
                            {"none", ToolChoice::Mode::kNone},
                            {"required", ToolChoice::Mode::kRequired}}) {
    auto c = parse_chat_request("{" + kMsgs + kTwoTools + R"(, "tool_choice": ")" + text + "\"}",
                                limits());
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->tool_choice.mode, mode);
    EXPECT_TRUE(c->parallel_tool_calls);
  }
  // Without tools: "auto" and "none" are harmless; an empty list is no tools.
  auto none =
      parse_chat_request("{" + kMsgs + R"(, "tools": [], "tool_choice": "none"})", limits());
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_TRUE(none->tools.empty());
}

std::string object_with_keys(int n) {
  std::string s = "{";
  for (int i = 0; i < n; ++i) s += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + "1";
  return s + "}";
}

// Keeping the tools' key order costs time quadratic in an object's size: a tool object is
// capped, and the rest of the body (here 200000 keys in an ignored field) is not re-read in
// order (that took minutes).
TEST(ParseChat, WideObjectsStayFastWithTools) {
  const std::string wide_tool = R"(, "tools": [{"type":"function","function":{"name":"f",
      "parameters":{"type":"object","properties":)" +
                                object_with_keys(257) + "}}}]";
  auto r = parse_chat_request("{" + kMsgs + wide_tool + "}", limits());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().param, "tools");
  const auto t0 = std::chrono::steady_clock::now();
  auto ok = parse_chat_request(
      "{" + kMsgs + kTwoTools + R"(, "unknown": )" + object_with_keys(200000) + "}", limits());
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->tools.size(), 2u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(ParseChat, DefaultsAreOpenAIs) {
  auto r = parse_chat_request("{" + kMsgs + "}", limits());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->model.has_value());
  EXPECT_FALSE(r->gen.max_tokens.has_value());
  EXPECT_EQ(r->gen.temperature, 1.0f);
  EXPECT_EQ(r->gen.n, 1);
  EXPECT_FALSE(r->gen.stream);
  EXPECT_FALSE(r->gen.seed.has_value());
  EXPECT_TRUE(r->tools.empty());
  EXPECT_EQ(r->tool_choice.mode, ToolChoice::Mode::kAuto);
  EXPECT_TRUE(r->parallel_tool_calls);
}

TEST(ParseCompletion, PromptForms) {
  auto text = parse_completion_request(R"({"prompt":"hello"})", limits());
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(std::get<std::string>(text->prompt), "hello");
  EXPECT_EQ(text->gen.max_tokens, 16);  // the legacy default
  auto ids =
      parse_completion_request(R"({"prompt":[1,2,3],"logprobs":2,"max_tokens":5})", limits());
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(std::get<std::vector<int32_t>>(ids->prompt), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(ids->gen.logprobs);
  EXPECT_EQ(ids->gen.top_logprobs, 2);
  EXPECT_EQ(ids->gen.max_tokens, 5);
  auto one_text = parse_completion_request(R"({"prompt":["hi"]})", limits());
  ASSERT_TRUE(one_text.ok());
  EXPECT_EQ(std::get<std::string>(one_text->prompt), "hi");
  auto one_ids = parse_completion_request(R"({"prompt":[[7,8]]})", limits());
  ASSERT_TRUE(one_ids.ok());
  EXPECT_EQ(std::get<std::vector<int32_t>>(one_ids->prompt), (std::vector<int32_t>{7, 8}));
}

TEST(ParseCompletion, RejectsBadInput) {
  const std::vector<BadCase> cases = {
      {"{}", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [1000]})", "prompt"},
      {R"({"prompt": [-1]})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt"},
      {R"({"prompt": [1.5]})", "prompt"},
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"prompt": [[1], [2]]})", "prompt"},
      {R"({"prompt": [[]]})", "prompt"},
      {R"({"prompt": "x", "echo": true, "logprobs": 1})", "echo"},
      {R"({"prompt": "x", "echo": 1})", "echo"},
      {R"({"prompt": "x", "suffix": "y"})", "suffix"},
      {R"({"prompt": "x", "logprobs": 6})", "logprobs"},
      {R"({"prompt": "x", "logprobs": true})", "logprobs"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
  };
  for (const BadCase& c : cases) {
    auto r = parse_completion_request(c.body, limits());
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.error().http_status, 400) << c.body;
    EXPECT_EQ(r.error().param.value_or(""), c.param) << c.body << " -> " << r.error().message;
  }
}

TEST(ApiError, StatusMapping) {
  EXPECT_EQ(error_from_status(InvalidArgument("x")).http_status, 400);
  EXPECT_EQ(error_from_status(ResourceExhausted("x")).http_status, 429);
  EXPECT_EQ(error_from_status(Unavailable("x")).http_status, 503);
  EXPECT_EQ(error_from_status(Internal("x")).http_status, 500);
  auto j = nlohmann::json::parse(bad_request("m", "p").to_json());
  EXPECT_EQ(j["error"]["message"], "m");
  EXPECT_EQ(j["error"]["param"], "p");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

}  // namespace
}  // namespace moeserve
