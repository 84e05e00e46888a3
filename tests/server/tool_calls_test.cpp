// Tool calls end to end: requests with tools over HTTP (the prompt the engine gets, the parsed
// message.tool_calls, the SSE deltas, tool_choice none / required / named, parallel_tool_calls)
// over a FakeEngine that scripts the model's tokens; and ChoiceOutput over real token streams
// delivered in every grouping the engine can produce.
#include <gtest/gtest.h>

#include <set>

#include "grammar/xgrammar_backend.h"
#include "harness.h"
#include "server/choice_output.h"
#include "server/tool_call_grammar.h"
#include "server/tool_call_parser.h"
#include "tokenizer/chat_messages_json.h"
#include "tool_call_text.h"

namespace moeserve::testing {
namespace {

using json = nlohmann::json;

const std::string kWeatherTool =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather of a city.",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}})";
const std::string kTimeTool = R"({"type":"function","function":{"name":"get_time"}})";

std::string request(const std::string& extra, bool stream = false) {
  return R"({"messages":[{"role":"user","content":"Weather in Paris and Tokyo?"}],"tools":[)" +
         kWeatherTool + "," + kTimeTool + "]" + (stream ? R"(,"stream":true)" : "") + extra + "}";
}

// The prompt the engine was given, as text.
std::string prompt_text(const Harness& h) {
  auto sub = h.engine.submitted();
  EXPECT_EQ(sub.size(), 1u);
  return sub.empty() ? "" : v3_tokenizer().decode(sub[0].prompt, /*skip_special=*/false);
}

struct Streamed {
  std::string content;
  json calls = json::array();  // rebuilt in the non-streaming form
  std::string finish;
};

// Rebuilds message content and tool_calls from SSE chunks, checking OpenAI's delta protocol.
Streamed collect(const std::string& body) {
  Streamed s;
  for (const json& e : sse_events(body)) {
    if (e == "[DONE]" || e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    EXPECT_TRUE(s.finish.empty()) << "a chunk after the finish";
    const json& d = c["delta"];
    if (d.contains("content") && d["content"].is_string()) s.content += d["content"];
    if (d.contains("tool_calls")) {
      EXPECT_FALSE(d["tool_calls"].empty());
      for (const json& tc : d["tool_calls"]) {
        const size_t index = tc["index"];
        if (tc.contains("id")) {  // the call's first delta
          EXPECT_EQ(index, s.calls.size());
          EXPECT_EQ(tc["type"], "function");
          EXPECT_FALSE(tc["function"]["name"].get<std::string>().empty());
          s.calls.push_back({{"id", tc["id"]},
                             {"type", tc["type"]},
                             {"function", {{"name", tc["function"]["name"]}, {"arguments", ""}}}});
        } else {
          EXPECT_FALSE(tc["function"].contains("name")) << "a name after the first delta";
          EXPECT_FALSE(tc["function"]["arguments"].get<std::string>().empty());
        }
        EXPECT_LT(index, s.calls.size()) << "arguments before the call's first delta";
        if (index < s.calls.size()) {
          s.calls[index]["function"]["arguments"] =
              s.calls[index]["function"]["arguments"].get<std::string>() +
              tc["function"]["arguments"].get<std::string>();
        }
      }
    }
    if (!c["finish_reason"].is_null()) s.finish = c["finish_reason"];
  }
  return s;
}

const std::string kTwoCalls = "Let me check." + kCallsBegin +
                              call("get_weather", R"({"city": "Paris"})") + "\n" +
                              call("get_weather", R"({"city": "東京"})") + kCallsEnd;

TEST(ToolCalls, NonStreamingReplyHasToolCallsContentAndFinishReason) {
  Harness h(scripted(kTwoCalls));
  auto r = h.post("/v1/chat/completions", request(""));
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["content"], "Let me check.");
  const json& calls = c["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  std::set<std::string> ids;
  for (const json& tc : calls) {
    EXPECT_EQ(tc["id"].get<std::string>().rfind("call_", 0), 0u);
    ids.insert(tc["id"]);
    EXPECT_EQ(tc["type"], "function");
    EXPECT_EQ(tc["function"]["name"], "get_weather");
  }
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city": "Paris"})");
  EXPECT_EQ(calls[1]["function"]["arguments"], R"({"city": "東京"})");
  // The prompt describes the tools after the (empty) system prompt, as the client wrote them.
  const std::string prompt = prompt_text(h);
  EXPECT_EQ(prompt.rfind("<｜begin▁of▁sentence｜># Tools\n\n", 0), 0u) << prompt;
  EXPECT_NE(prompt.find(R"({"type": "function", "function": {"name": "get_weather", )"
                        R"("description": "Weather of a city.", "parameters": )"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find(R"({"type": "function", "function": {"name": "get_time"}})"),
            std::string::npos);
  EXPECT_TRUE(prompt.ends_with("<｜User｜>Weather in Paris and Tokyo?<｜Assistant｜>"));
}

TEST(ToolCalls, StreamingDeltasGiveTheSameCallsAsTheNonStreamingReply) {
  Harness h(scripted(kTwoCalls));
  json blocking = json::parse(h.post("/v1/chat/completions", request(""))->body);
  auto r = h.post("/v1/chat/completions", request("", /*stream=*/true));
  ASSERT_EQ(r->status, 200) << r->body;
  Streamed s = collect(r->body);
  EXPECT_EQ(s.finish, "tool_calls");
  EXPECT_EQ(s.content, "Let me check.");
  const json& want = blocking["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(s.calls.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(s.calls[i]["function"], want[i]["function"]);
    EXPECT_EQ(s.calls[i]["id"].get<std::string>().rfind("call_", 0), 0u);
  }
  EXPECT_EQ(r->body.find("tool▁"), std::string::npos) << "a special token leaked";
}

TEST(ToolCalls, AModelThatDoesNotCallAnswersWithContent) {
  Harness h(scripted("It is sunny."));
  json j = json::parse(h.post("/v1/chat/completions", request(""))->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "It is sunny.");
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
}

// Regression: a calls block without a complete call gave finish_reason "tool_calls" and an
// empty list.
TEST(ToolCalls, ABlockWithoutCallsIsAPlainStop) {
  Harness h(scripted("Hm." + kCallsBegin + kCallsEnd));
  json j = json::parse(h.post("/v1/chat/completions", request(""))->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hm.");
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
  Streamed s = collect(h.post("/v1/chat/completions", request("", true))->body);
  EXPECT_EQ(s.finish, "stop");
  EXPECT_TRUE(s.calls.empty());
}

TEST(ToolCalls, OnlyCallsGiveNullContent) {
  Harness h(scripted(kCallsBegin + call("get_time", "{}") + kCallsEnd));
  json j = json::parse(h.post("/v1/chat/completions", request(""))->body);
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{}");
}

TEST(ToolCalls, ToolChoiceNoneNeitherDescribesNorParses) {
  Harness h(scripted(kTwoCalls));
  json j = json::parse(h.post("/v1/chat/completions", request(R"(,"tool_choice":"none")"))->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["message"]["content"], kTwoCalls);  // the text as generated
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(prompt_text(h).find("# Tools"), std::string::npos);
}

TEST(ToolCalls, NamedToolChoiceOpensTheCallInThePrompt) {
  // The model only writes the arguments: the prompt already holds the call's start.
  Harness h(scripted(R"({"city": "Paris"})" + std::string("\n```") + kCallEnd + kCallsEnd));
  const std::string choice =
      R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}})";
  json j = json::parse(h.post("/v1/chat/completions", request(choice))->body);
  EXPECT_TRUE(prompt_text(h).ends_with("<｜Assistant｜>" + kCallsBegin + kCallBegin + "function" +
                                       kSep + "get_weather\n```json\n"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            R"({"city": "Paris"})");
  Streamed s = collect(h.post("/v1/chat/completions", request(choice, true))->body);
  EXPECT_EQ(s.finish, "tool_calls");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(s.calls[0]["function"]["arguments"], R"({"city": "Paris"})");
}

TEST(ToolCalls, RequiredToolChoiceOpensACallTheModelNames) {
  Harness h(scripted("get_time\n```json\n{}\n```" + kCallEnd + kCallsEnd));
  json j =
      json::parse(h.post("/v1/chat/completions", request(R"(,"tool_choice":"required")"))->body);
  EXPECT_TRUE(
      prompt_text(h).ends_with("<｜Assistant｜>" + kCallsBegin + kCallBegin + "function" + kSep));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_time");
}

TEST(ToolCalls, ParallelToolCallsFalseKeepsTheFirstCall) {
  Harness h(scripted(kTwoCalls));
  json j =
      json::parse(h.post("/v1/chat/completions", request(R"(,"parallel_tool_calls":false)"))->body);
  ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            R"({"city": "Paris"})");
  Streamed s = collect(
      h.post("/v1/chat/completions", request(R"(,"parallel_tool_calls":false)", true))->body);
  EXPECT_EQ(s.calls.size(), 1u);
}

TEST(ToolCalls, ACallCutByMaxTokensKeepsWhatArrivedWithLength) {
  Harness h(scripted(kTwoCalls));
  const Tokenizer& tok = v3_tokenizer();
  const std::vector<int32_t> ids = tok.encode(kTwoCalls, false);
  // Cut two tokens into the first call's arguments.
  const std::string head =
      "Let me check." + kCallsBegin + kCallBegin + "function" + kSep + "get_weather\n```json\n";
  size_t n = 0;
  while (tok.decode(std::vector<int32_t>(ids.begin(), ids.begin() + n), false).size() <
         head.size()) {
    ++n;
  }
  n += 2;
  const std::string cut = tok.decode(std::vector<int32_t>(ids.begin(), ids.begin() + n), false);
  ASSERT_TRUE(cut.starts_with(head) && cut.size() > head.size()) << cut;
  json j = json::parse(
      h.post("/v1/chat/completions", request(",\"max_tokens\":" + std::to_string(n)))->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            cut.substr(head.size()));
}

// R1: calls come after the reasoning; the prompt opens <think>, so "required" prefills nothing
// (the model reasons first) and the call is parsed from the answer.
TEST(ToolCalls, R1CallsFollowTheReasoning) {
  Harness h(
      scripted("Need the weather.</think>" + kCallsBegin +
               call("get_weather", R"({"city": "Paris"})") + kCallsEnd),
      {}, {},
      ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekR1, v3_tokenizer().bos_token()));
  json j =
      json::parse(h.post("/v1/chat/completions", request(R"(,"tool_choice":"required")"))->body);
  EXPECT_TRUE(prompt_text(h).ends_with("<｜Assistant｜><think>\n"));
  const json& m = j["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "Need the weather.");
  EXPECT_TRUE(m["content"].is_null());
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"city": "Paris"})");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
}

// DeepSeek-V3.1: its model card's tool description in the prompt, its call syntax (no type, no
// fences, calls chained) parsed, streamed and forced the same way.
ChatTemplate v3_1_template() {
  return ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekV3_1, v3_tokenizer().bos_token());
}

const std::string kTwoCallsV3_1 = "Let me check." + kCallsBegin +
                                  call_v3_1("get_weather", R"({"city": "Paris"})") +
                                  call_v3_1("get_weather", R"({"city": "東京"})") + kCallsEnd;

TEST(ToolCalls, V3_1CallsAreParsedAndStreamedInItsSyntax) {
  Harness h(scripted(kTwoCallsV3_1), {}, {}, v3_1_template());
  json j = json::parse(h.post("/v1/chat/completions", request(""))->body);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["content"], "Let me check.");
  const json& calls = c["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city": "Paris"})");
  EXPECT_EQ(calls[1]["function"]["arguments"], R"({"city": "東京"})");
  const std::string prompt = prompt_text(h);
  EXPECT_EQ(prompt.rfind("<｜begin▁of▁sentence｜>\n\n## Tools\nYou have access to the following "
                         "tools:\n\n### get_weather\nDescription: Weather of a city.\n\n"
                         R"(Parameters: {"type": "object", "properties": {"city": {"type": )"
                         R"("string"}}, "required": ["city"]})"
                         "\n\n### get_time\nDescription: \n\nParameters: {}\n\nIMPORTANT: ",
                         0),
            0u)
      << prompt;
  EXPECT_TRUE(
      prompt.ends_with("For multiple tool calls, chain them directly without separators "
                       "or spaces<｜User｜>Weather in Paris and Tokyo?<｜Assistant｜></think>"))
      << prompt;
  Streamed s = collect(h.post("/v1/chat/completions", request("", /*stream=*/true))->body);
  EXPECT_EQ(s.finish, "tool_calls");
  EXPECT_EQ(s.content, "Let me check.");
  ASSERT_EQ(s.calls.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(s.calls[i]["function"], calls[i]["function"]);
}

TEST(ToolCalls, V3_1ToolChoiceOpensTheCallInItsSyntax) {
  {
    Harness h(scripted(R"({"city": "Paris"})" + kCallEnd + kCallsEnd), {}, {}, v3_1_template());
    const std::string choice =
        R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}})";
    json j = json::parse(h.post("/v1/chat/completions", request(choice))->body);
    EXPECT_TRUE(prompt_text(h).ends_with("<｜Assistant｜></think>" + kCallsBegin + kCallBegin +
                                         "get_weather" + kSep));
    ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
              R"({"city": "Paris"})");
  }
  Harness h(scripted("get_time" + kSep + "{}" + kCallEnd + kCallsEnd), {}, {}, v3_1_template());
  json j =
      json::parse(h.post("/v1/chat/completions", request(R"(,"tool_choice":"required")"))->body);
  EXPECT_TRUE(prompt_text(h).ends_with("<｜Assistant｜></think>" + kCallsBegin + kCallBegin));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{}");
}

// An empty content beside tool calls (as many clients send) is taken as null, so the template
// renders the calls.
TEST(ToolCalls, ToolResultsInTheConversationAreRenderedByTheTemplate) {
  Harness h(scripted("Paris is sunny."));
  const std::string body =
      R"({"messages":[{"role":"user","content":"Weather?"},
          {"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function",
            "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
          {"role":"tool","tool_call_id":"call_1","content":"sunny"}],"tools":[)" +
      kWeatherTool + "]}";
  auto r = h.post("/v1/chat/completions", body);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["message"]["content"], "Paris is sunny.");
  EXPECT_TRUE(prompt_text(h).ends_with("<｜User｜>Weather?<｜Assistant｜>" + kCallsBegin +
                                       call("get_weather", R"({"city": "Paris"})") +
                                       "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>sunny<"
                                       "｜tool▁output▁end｜><｜tool▁outputs▁end｜>"));
}

TEST(ToolCalls, BadToolRequestsAre400) {
  Harness h(scripted("x"));
  auto r = h.post("/v1/chat/completions",
                  request(R"(,"tool_choice":{"type":"function","function":{"name":"nope"}})"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "tool_choice");
  r = h.post("/v1/chat/completions", R"({"messages":[{"role":"tool","content":"x"}]})");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "messages[0].tool_call_id");
  EXPECT_TRUE(h.engine.submitted().empty());
}

// ChoiceOutput over the real tokenizer: the engine delivers tokens in groups of any size, and
// stop strings hold back text inside a token's characters; every grouping gives the one-shot
// parse of the whole text.
TEST(ToolCalls, ChoiceOutputMatchesTheOneShotParseForEveryTokenGrouping) {
  const Tokenizer& tok = v3_tokenizer();
  const std::vector<std::pair<std::string, ToolCallSyntax>> texts = {
      {kTwoCalls, ToolCallSyntax::kV3},
      {"答えは" + kCallsBegin + call("f", R"({"q": "｜▁ 世界"})") + kCallsEnd + " tail",
       ToolCallSyntax::kV3},
      {"no calls < here", ToolCallSyntax::kV3},
      {kTwoCallsV3_1, ToolCallSyntax::kV3_1},
      {"答えは" + kCallsBegin + call_v3_1("f", R"({"q": "｜▁ 世界"})") + kCallsEnd + " tail",
       ToolCallSyntax::kV3_1}};
  // Never found, but their prefixes ("｜>", "▁sep｜>") hold text back mid-token.
  const std::vector<std::vector<std::string>> stop_sets = {{}, {"｜>!", "▁sep｜>!"}};
  int64_t runs = 0;
  for (const auto& [text, syntax] : texts) {
    const std::vector<int32_t> ids = tok.encode(text, false);
    const ParsedToolCalls want =
        parse_tool_calls(tok.decode(ids, /*skip_special=*/true), std::nullopt, syntax);
    EXPECT_EQ(want.calls.empty(), text.find(kCallsBegin) == std::string::npos);
    for (const auto& stops : stop_sets) {
      for (size_t i = 0; i <= ids.size(); ++i) {
        for (size_t j = i; j <= ids.size(); ++j) {
          ChoiceOutput out(tok, stops, ReasoningMode{},
                           ToolCallMode{true, std::nullopt, "", syntax});
          ParsedToolCalls got;
          auto take = [&](const ChoiceDelta& d) {
            got.content += d.content;
            for (const ToolCallDelta& c : d.tool_calls) {
              if (c.opens) got.calls.push_back({c.type, c.name, ""});
              ASSERT_LT(size_t(c.index), got.calls.size());
              got.calls[size_t(c.index)].arguments += c.arguments;
            }
          };
          for (auto [a, b] : {std::pair{size_t(0), i}, {i, j}, {j, ids.size()}}) {
            std::vector<GeneratedToken> group;
            for (size_t k = a; k < b; ++k) group.push_back({ids[k], 0.0f, {}});
            take(out.on_tokens(group));
          }
          ChoiceDelta last = out.on_finish(FinishReason::kStop);
          take(last);
          ASSERT_EQ(got.content, want.content) << text << " cut at tokens " << i << ", " << j;
          ASSERT_EQ(got.calls, want.calls) << text << " cut at tokens " << i << ", " << j;
          EXPECT_EQ(*last.finish_reason, want.calls.empty() ? "stop" : "tool_calls");
          ++runs;
        }
      }
    }
  }
  EXPECT_GT(runs, 1000);
}

// DeepSeek-V3.2 (its encoder, DSML calls) over HTTP: the prompt the engine gets, the calls as
// JSON arguments, streamed and not, thinking mode's reasoning, a forced call's prefill, and
// V3.2-Speciale's reasoning-only mode.
ChatTemplate v32() {
  return ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekV3_2, v3_tokenizer().bos_token());
}

// A named tool_choice in chat mode: the prompt opens the call in the template's DSML block
// (`block`: function_calls for V3.2, tool_calls for V4); the model writes the rest, which comes
// back as the call's JSON arguments.
void expect_named_call_prefilled(const ChatTemplate& t, const std::string& block) {
  Harness f(scripted("<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
                     "</｜DSML｜invoke>\n</｜DSML｜" +
                     block + ">"),
            {}, {}, t);
  json k = json::parse(
      f.post("/v1/chat/completions",
             request(R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}})"))
          ->body);
  EXPECT_TRUE(prompt_text(f).ends_with("</think>\n\n<｜DSML｜" + block +
                                       ">\n<｜DSML｜invoke name=\"get_weather\">\n"))
      << prompt_text(f);
  ASSERT_EQ(k["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(k["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            R"({"city": "Paris"})");
}

const std::string kDsmlCall =
    "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">東京</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜function_calls>";

TEST(ToolCalls, V32CallsComeBackAsJsonArguments) {
  Harness h(scripted("Checking." + kDsmlCall), {}, {}, v32());
  auto r = h.post("/v1/chat/completions", request(""));
  ASSERT_EQ(r->status, 200) << r->body;
  const json c = json::parse(r->body)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["content"], "Checking.");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city": "東京", "days": 3})"));
  // The prompt: an empty system message carrying the tools, the user turn, chat mode.
  const std::string prompt = prompt_text(h);
  EXPECT_EQ(prompt.rfind("<｜begin▁of▁sentence｜>\n\n## Tools\n", 0), 0u) << prompt;
  EXPECT_NE(prompt.find(R"({"name": "get_time"})"), std::string::npos) << prompt;
  EXPECT_TRUE(prompt.ends_with("<｜User｜>Weather in Paris and Tokyo?<｜Assistant｜></think>"));
  auto sr = h.post("/v1/chat/completions", request("", /*stream=*/true));
  Streamed s = collect(sr->body);
  EXPECT_EQ(s.finish, "tool_calls");
  EXPECT_EQ(s.content, "Checking.");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0]["function"], c["message"]["tool_calls"][0]["function"]);
  EXPECT_EQ(sr->body.find("DSML"), std::string::npos) << "the syntax leaked";
}

TEST(ToolCalls, V32ThinkingSplitsReasoningAndAForcedCallIsPrefilled) {
  Harness h(scripted("Paris first.</think>" + kDsmlCall), {}, {}, v32());
  json j = json::parse(
      h.post("/v1/chat/completions", request(R"(,"chat_template_kwargs":{"thinking":true})"))
          ->body);
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "Paris first.");
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_TRUE(prompt_text(h).ends_with("<｜Assistant｜><think>"));
  expect_named_call_prefilled(v32(), "function_calls");
}

// DeepSeek-V4 (encoding_dsv4.py, its <｜DSML｜tool_calls> block) over HTTP: the calls as JSON
// arguments, streamed and not; V4's tool description in the prompt; a tool result as a
// <tool_result> block of a user turn; thinking mode keeps the reasoning of every turn when the
// request has tools; a named tool_choice opens V4's block; V3.2's block is not a V4 call.
ChatTemplate v4() {
  return ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekV4, v3_tokenizer().bos_token());
}
std::string v4_call() {
  std::string c = kDsmlCall;
  for (size_t at; (at = c.find("function_calls")) != std::string::npos;) {
    c.replace(at, 14, "tool_calls");
  }
  return c;
}

TEST(ToolCalls, V4CallsComeBackAsJsonArgumentsInItsBlock) {
  Harness h(scripted("Checking." + v4_call()), {}, {}, v4());
  auto r = h.post("/v1/chat/completions", request(""));
  ASSERT_EQ(r->status, 200) << r->body;
  const json c = json::parse(r->body)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["content"], "Checking.");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city": "東京", "days": 3})"));
  const std::string prompt = prompt_text(h);
  EXPECT_EQ(prompt.rfind("<｜begin▁of▁sentence｜>\n\n## Tools\n\nYou have access", 0), 0u)
      << prompt;
  EXPECT_TRUE(prompt.ends_with("<｜User｜>Weather in Paris and Tokyo?<｜Assistant｜></think>"));
  auto sr = h.post("/v1/chat/completions", request("", /*stream=*/true));
  Streamed s = collect(sr->body);
  EXPECT_EQ(s.finish, "tool_calls");
  EXPECT_EQ(s.content, "Checking.");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0]["function"], c["message"]["tool_calls"][0]["function"]);
  EXPECT_EQ(sr->body.find("DSML"), std::string::npos) << "the syntax leaked";
  // V3.2's block is text to V4.
  Harness old(scripted("Checking." + kDsmlCall), {}, {}, v4());
  const json o = json::parse(old.post("/v1/chat/completions", request(""))->body)["choices"][0];
  EXPECT_EQ(o["finish_reason"], "stop");
  EXPECT_FALSE(o["message"].contains("tool_calls")) << o.dump();
  EXPECT_EQ(o["message"]["content"], "Checking." + kDsmlCall);
}

TEST(ToolCalls, V4ToolResultsThinkingAndAForcedCall) {
  Harness h(scripted("Done.</think>Sunny."), {}, {}, v4());
  const std::string body = R"({"messages":[{"role":"user","content":"Weather?"},
      {"role":"assistant","content":null,"reasoning_content":"Look it up.","tool_calls":[
        {"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"sunny"}],
    "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],
    "chat_template_kwargs":{"thinking":true}})";
  auto r = h.post("/v1/chat/completions", body);
  ASSERT_EQ(r->status, 200) << r->body;
  const json m = json::parse(r->body)["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "Done.");
  EXPECT_EQ(m["content"], "Sunny.");
  EXPECT_TRUE(prompt_text(h).ends_with(
      "<｜User｜>Weather?<｜Assistant｜><think>Look it up.</think>\n\n<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
      "<｜User｜><tool_result>sunny</tool_result><｜Assistant｜><think>"))
      << prompt_text(h);
  expect_named_call_prefilled(v4(), "tool_calls");
}

TEST(ToolCalls, V32SpecialeThinksAlwaysAndRefusesTools) {
  ServiceOptions so;
  so.reasoning_only = true;
  Harness h(scripted("hmm</think>42"), {}, so, v32());
  auto r = h.post("/v1/chat/completions", request(""));
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "tools");
  json j = json::parse(
      h.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"6*7?"}]})")->body);
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "hmm");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "42");
  EXPECT_TRUE(prompt_text(h).ends_with("<｜User｜>6*7?<｜Assistant｜><think>"));
}

// Calls are constrained (with a grammar backend): a forced call gets the grammar of what follows
// its prefill (the named function's arguments; for `required` every tool's name, then its
// arguments, and more calls when parallel calls are allowed); `auto` gets one only when a tool
// is `strict` (free text until the model opens a block of calls); a prompt that opens <think>
// gets the calls after the thinking; ignore_eos none. The grammars' walks are checked in
// tests/grammar (XGrammarBackend.*ToolCallWalks*).
TEST(ToolCalls, CallsCarryTheirGrammar) {
  ServiceOptions so;
  auto backend = XGrammarBackend::create(v3_tokenizer(), 129280);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  so.grammar = std::move(*backend);
  auto grammar_of = [&](const std::string& extra, std::optional<ChatTemplate> tmpl = std::nullopt,
                        const std::string& tools = "") {
    Harness h(scripted("{}"), {}, so, tmpl);
    std::string body = request(extra);
    if (!tools.empty()) {
      body = R"({"messages":[{"role":"user","content":"Weather?"}],"tools":[)" + tools + "]" +
             extra + "}";
    }
    auto r = h.post("/v1/chat/completions", body);
    EXPECT_EQ(r->status, 200) << r->body;
    auto sub = h.engine.submitted();
    EXPECT_EQ(sub.size(), 1u);
    return sub.empty() ? std::optional<GrammarSpec>() : sub[0].grammar;
  };
  const ToolCallFormat f = tool_call_format(ToolCallSyntax::kV3);
  auto tools = parse_tools_json("[" + kWeatherTool + "," + kTimeTool + "]");
  ASSERT_TRUE(tools.ok());
  auto named =
      grammar_of(R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}})");
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(named->kind, GrammarSpec::Kind::kStructuralTag);
  EXPECT_EQ(*named, forced_call_grammar(*tools, f, "get_weather", true));
  EXPECT_EQ(grammar_of(R"(,"tool_choice":"required")"),
            forced_call_grammar(*tools, f, std::nullopt, true));
  EXPECT_EQ(grammar_of(R"(,"tool_choice":"required","parallel_tool_calls":false)"),
            forced_call_grammar(*tools, f, std::nullopt, false));
  EXPECT_FALSE(grammar_of("").has_value());  // auto, no strict tool
  const std::string strict_tool =
      R"({"type":"function","function":{"name":"get_weather","strict":true,)"
      R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}})";
  auto strict_tools = parse_tools_json("[" + strict_tool + "]");
  ASSERT_TRUE(strict_tools.ok());
  EXPECT_EQ(grammar_of("", std::nullopt, strict_tool),
            triggered_call_grammar(*strict_tools, f, std::nullopt, true, false));
  EXPECT_FALSE(grammar_of(R"(,"tool_choice":"required","ignore_eos":true)").has_value());
  // V3.2's DSML calls, and a thinking prompt: the thinking first, within max_tokens less the
  // room kept for the calls.
  EXPECT_EQ(
      grammar_of(R"(,"tool_choice":"required")", v32()),
      forced_call_grammar(*tools, tool_call_format(ToolCallSyntax::kDsml), std::nullopt, true));
  EXPECT_EQ(grammar_of(R"(,"tool_choice":"required","max_tokens":100,)"
                       R"("chat_template_kwargs":{"thinking":true})",
                       v3_1_template()),
            triggered_call_grammar(*tools, tool_call_format(ToolCallSyntax::kV3_1), std::nullopt,
                                   true, true, ThinkingBudget{50}));
}

}  // namespace
}  // namespace moeserve::testing

namespace moeserve::testing {
namespace {

// reasoning_effort and the latest_reminder role reach DeepSeek-V4's prompt as encoding_dsv4.py
// writes them: "max" (and xhigh) puts its effort text before the first turn in thinking mode;
// low, medium and high are DeepSeek's "high", which the encoder writes as no effort at all; any
// effort but "none" turns thinking on unless chat_template_kwargs says otherwise. A template
// without the role refuses a latest_reminder turn by name; an unknown effort is a 400.
TEST(ToolCalls, V4ReasoningEffortAndLatestReminderReachThePrompt) {
  const std::string user = R"({"role":"user","content":"Is 91 prime?"})";
  auto prompt_of = [&](const std::string& extra, const std::string& more_messages = "") {
    Harness h(scripted("No."), {}, {}, v4());
    auto r = h.post("/v1/chat/completions",
                    R"({"messages":[)" + user + more_messages + "]" + extra + "}");
    EXPECT_EQ(r->status, 200) << r->body;
    return prompt_text(h);
  };
  const std::string thinking = prompt_of(R"(,"chat_template_kwargs":{"thinking":true})");
  EXPECT_TRUE(thinking.ends_with("<｜Assistant｜><think>")) << thinking;
  for (const char* effort : {"low", "medium", "high"}) {
    EXPECT_EQ(prompt_of(std::string(R"(,"reasoning_effort":")") + effort + "\""), thinking)
        << effort;
  }
  const std::string max = prompt_of(R"(,"reasoning_effort":"max")");
  EXPECT_EQ(max.find("Reasoning Effort: Absolute maximum with no shortcuts permitted."),
            std::string("<｜begin▁of▁sentence｜>").size())
      << max;
  EXPECT_EQ(prompt_of(R"(,"reasoning_effort":"xhigh")"), max);
  EXPECT_TRUE(max.ends_with("<｜Assistant｜><think>"));
  // "none" and an explicit switch keep thinking off.
  const std::string off = prompt_of("");
  EXPECT_TRUE(off.ends_with("<｜Assistant｜></think>")) << off;
  EXPECT_EQ(prompt_of(R"(,"reasoning_effort":"none")"), off);
  EXPECT_EQ(prompt_of(R"(,"reasoning_effort":"max","chat_template_kwargs":{"thinking":false})"),
            off);
  const std::string reminder =
      prompt_of("", R"(,{"role":"latest_reminder","content":"Answer in one word."})");
  EXPECT_NE(reminder.find("<｜latest_reminder｜>Answer in one word."), std::string::npos)
      << reminder;
  {
    Harness h(scripted("No."), {}, {}, v4());
    auto r = h.post("/v1/chat/completions",
                    R"({"messages":[)" + user + R"(],"reasoning_effort":"extreme"})");
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(json::parse(r->body)["error"]["param"], "reasoning_effort") << r->body;
  }
  Harness v3(scripted("No."));
  auto r = v3.post("/v1/chat/completions",
                   R"({"messages":[)" + user +
                       R"(,{"role":"latest_reminder","content":"Answer in one word."}]})");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "messages[1].role") << r->body;
}

// A message's `task` reaches V4's prompt as encoding_dsv4.py writes it (the fixtures hold the
// forms); an unknown task is a 400, not a prompt; a non-string one names the field.
TEST(ToolCalls, V4TasksReachThePromptAndAnUnknownOneIsA400) {
  auto post = [&](const std::string& task) {
    Harness h(scripted("Search"), {}, {}, v4());
    auto r =
        h.post("/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"Hot springs?","task":)" + task + "}]}");
    return std::make_pair(r->status, r->status == 200 ? prompt_text(h) : r->body);
  };
  const auto [status, action] = post(R"("action")");
  EXPECT_EQ(status, 200) << action;
  EXPECT_TRUE(action.ends_with("Hot springs?<｜Assistant｜></think><｜action｜>")) << action;
  EXPECT_TRUE(post(R"("title")").second.ends_with("Hot springs?<｜title｜>"));
  const auto [bad, body] = post(R"("summarise")");
  EXPECT_EQ(bad, 400);
  EXPECT_NE(body.find("unknown task 'summarise'"), std::string::npos) << body;
  const auto [wrong, why] = post("7");
  EXPECT_EQ(wrong, 400);
  EXPECT_NE(why.find("task"), std::string::npos) << why;
}

}  // namespace
}  // namespace moeserve::testing
