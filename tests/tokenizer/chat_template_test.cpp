// The native chat templates against jinja2 rendering the real templates (committed fixtures:
// the DeepSeek-V3 template from assets/, the DeepSeek-R1 one and the first R1 release's).
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "fixtures.h"
#include "tokenizer/chat_messages_json.h"
#include "tokenizer/chat_template.h"

namespace moeserve {
namespace {

std::string r1_template() {
  const auto cfg = nlohmann::json::parse(
      testing::read_all(std::string(testing::kDataDir) + "/r1_tokenizer_config.json"));
  return cfg["chat_template"].get<std::string>();
}

// The first R1 release: the same template without "<think>\n" in the generation prompt.
std::string r1_original_template() {
  std::string t = r1_template();
  const std::string from = "{{'<｜Assistant｜><think>\\n'}}";
  const size_t at = t.find(from);
  EXPECT_NE(at, std::string::npos);
  if (at != std::string::npos) t.replace(at, from.size(), "{{'<｜Assistant｜>'}}");
  return t;
}

TEST(ChatTemplate, RecognisesTheVariants) {
  const Tokenizer& tok = testing::deepseek_v3();
  auto v3 = ChatTemplate::for_tokenizer(tok);
  ASSERT_TRUE(v3.ok()) << v3.status().to_string();
  EXPECT_EQ(v3->variant(), ChatTemplate::Variant::kDeepSeekV3);
  EXPECT_FALSE(v3->generation_opens_think());
  auto r1 = ChatTemplate::from_template(r1_template(), tok.bos_token());
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->variant(), ChatTemplate::Variant::kDeepSeekR1);
  EXPECT_TRUE(r1->generation_opens_think());
  auto r1o = ChatTemplate::from_template(r1_original_template(), tok.bos_token());
  ASSERT_TRUE(r1o.ok());
  EXPECT_FALSE(r1o->generation_opens_think());
}

TEST(ChatTemplate, RejectsAnUnknownTemplate) {
  auto t = ChatTemplate::from_template(
      "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{% endfor "
      "%}",
      "");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
}

TEST(ChatTemplate, MatchesJinja2OnEveryFixtureConversation) {
  const Tokenizer& tok = testing::deepseek_v3();
  const auto rows = testing::read_jsonl(std::string(testing::kDataDir) + "/chat.jsonl");
  ASSERT_GE(rows.size(), 50u);
  const auto v3 = ChatTemplate::for_tokenizer(tok);
  const auto r1 = ChatTemplate::from_template(r1_template(), tok.bos_token());
  const auto r1o = ChatTemplate::from_template(r1_original_template(), tok.bos_token());
  ASSERT_TRUE(v3.ok() && r1.ok() && r1o.ok());
  size_t with_tools = 0, with_think = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    auto msgs = parse_messages_json(row["messages"].dump());
    ASSERT_TRUE(msgs.ok()) << msgs.status().to_string();
    const bool gen = row["add_generation_prompt"].get<bool>();
    for (const auto& [name, tmpl] : {std::pair{"v3", &*v3}, {"r1", &*r1}, {"r1_original", &*r1o}}) {
      auto text = tmpl->render(*msgs, gen);
      ASSERT_TRUE(text.ok()) << name << " row " << i << ": " << text.status().to_string();
      EXPECT_EQ(*text, row[name].get<std::string>())
          << name << " row " << i << ": " << row["messages"].dump();
    }
    for (const Message& m : *msgs) {
      if (m.tool_calls) ++with_tools;
      if (m.content && m.content->find("</think>") != std::string::npos) ++with_think;
    }
  }
  EXPECT_GE(with_tools, 10u);
  EXPECT_GE(with_think, 10u);
}

// Requests with `tools`: the description after the system prompt (jinja2 rendering the real
// templates with TOOLS_BLOCK of tools/gen_tokenizer_fixtures.py inserted, V3.1's with
// V3_1_TOOLS_BLOCK, its model card's description), tool calls, results. Rows are read as
// ordered JSON: the tools' keys keep the client's order, as tojson writes them.
TEST(ChatTemplate, WithToolsMatchesJinja2OnEveryFixtureConversation) {
  const Tokenizer& tok = testing::deepseek_v3();
  const auto v3 = ChatTemplate::for_tokenizer(tok);
  const auto r1 = ChatTemplate::from_template(r1_template(), tok.bos_token());
  ASSERT_TRUE(v3.ok() && r1.ok());
  const auto later = [&](const char* file) {
    auto t = ChatTemplate::from_template(
        testing::read_all(std::string(testing::kDataDir) + "/templates/" + file + ".jinja"),
        tok.bos_token());
    EXPECT_TRUE(t.ok()) << file;
    return *t;
  };
  const ChatTemplate v3_0324 = later("v3-0324"), r1_0528 = later("r1-0528"), v3_1 = later("v3.1");
  std::istringstream in(testing::read_all(std::string(testing::kDataDir) + "/chat_tools.jsonl"));
  size_t rows = 0, with_calls = 0, with_results = 0;
  for (std::string line; std::getline(in, line); ++rows) {
    const auto row = nlohmann::ordered_json::parse(line);
    auto msgs = parse_messages_json(row["messages"].dump());
    ASSERT_TRUE(msgs.ok()) << msgs.status().to_string();
    auto tools = parse_tools_json(row["tools"].dump());
    ASSERT_TRUE(tools.ok()) << tools.status().to_string();
    ASSERT_FALSE(tools->empty());
    const bool gen = row["add_generation_prompt"].get<bool>();
    for (const auto& [name, tmpl] : {std::pair{"v3", &*v3},
                                     {"r1", &*r1},
                                     {"v3-0324", &v3_0324},
                                     {"r1-0528", &r1_0528},
                                     {"v3.1", &v3_1}}) {
      auto text = tmpl->render(*msgs, gen, *tools);
      ASSERT_TRUE(text.ok()) << name << " row " << rows << ": " << text.status().to_string();
      EXPECT_EQ(*text, row[name].get<std::string>()) << name << " row " << rows;
    }
    for (const Message& m : *msgs) {
      if (m.tool_calls) ++with_calls;
      if (m.role == "tool") ++with_results;
    }
  }
  EXPECT_GE(rows, 15u);
  EXPECT_GE(with_calls, 6u);
  EXPECT_GE(with_results, 6u);
}

// The later templates (tests/data/tokenizer/templates: DeepSeek-V3-0324, R1-0528 and V3.1,
// whose template V3.1-Terminus shares) against jinja2 on tools/gen_chat_template_fixtures.py's
// conversations: the same text, or an error where jinja2 raises one; V3.1 with thinking off
// (its default) and on.
TEST(ChatTemplate, LaterTemplatesMatchJinja2OnEveryFixtureConversation) {
  const Tokenizer& tok = testing::deepseek_v3();
  struct Family {
    const char* file;
    ChatTemplate::Variant variant;
  };
  const Family families[] = {{"v3-0324", ChatTemplate::Variant::kDeepSeekV3_0324},
                             {"r1-0528", ChatTemplate::Variant::kDeepSeekR1_0528},
                             {"v3.1", ChatTemplate::Variant::kDeepSeekV3_1}};
  std::map<std::string, ChatTemplate> templates;
  for (const Family& f : families) {
    auto t = ChatTemplate::from_template(
        testing::read_all(std::string(testing::kDataDir) + "/templates/" + f.file + ".jinja"),
        tok.bos_token());
    ASSERT_TRUE(t.ok()) << f.file << ": " << t.status().to_string();
    EXPECT_EQ(t->variant(), f.variant) << f.file;
    templates.emplace(f.file, *t);
  }
  EXPECT_TRUE(templates.at("r1-0528").reasons());
  EXPECT_FALSE(templates.at("r1-0528").generation_opens_think());
  EXPECT_FALSE(templates.at("v3-0324").reasons());
  EXPECT_FALSE(templates.at("v3.1").reasons(false));
  EXPECT_TRUE(templates.at("v3.1").reasons(true));
  EXPECT_TRUE(templates.at("v3.1").generation_opens_think(true));
  const auto rows = testing::read_jsonl(std::string(testing::kDataDir) + "/chat_families.jsonl");
  ASSERT_GE(rows.size(), 100u);
  std::map<std::string, int> rendered, refused;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    auto msgs = parse_messages_json(row["messages"].dump());
    ASSERT_TRUE(msgs.ok()) << msgs.status().to_string();
    const bool gen = row["add_generation_prompt"].get<bool>();
    for (const char* name : {"v3-0324", "r1-0528", "v3.1", "v3.1-thinking"}) {
      const bool thinking = std::string(name) == "v3.1-thinking";
      const ChatTemplate& t = templates.at(thinking ? "v3.1" : name);
      auto text = t.render(*msgs, gen, {}, thinking);
      const auto& want = row[name];
      if (want.is_object()) {  // jinja2 raised
        EXPECT_FALSE(text.ok()) << name << " row " << i << ": jinja2 refused ("
                                << want["error"].get<std::string>() << ")";
        if (!text.ok()) {
          EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
        }
        ++refused[name];
        continue;
      }
      ASSERT_TRUE(text.ok()) << name << " row " << i << ": " << text.status().to_string();
      EXPECT_EQ(*text, want.get<std::string>())
          << name << " row " << i << ": " << row["messages"].dump();
      ++rendered[name];
    }
  }
  for (const char* name : {"v3-0324", "r1-0528", "v3.1", "v3.1-thinking"}) {
    std::printf("[ %s ] %d rendered equal to jinja2, %d refused as jinja2 refuses\n", name,
                rendered[name], refused[name]);
    EXPECT_GE(rendered[name], 90) << name;
  }
}

// What a run over an encoder's fixture rows saw (rows of kind "render").
struct EncoderFixtureRun {
  int rendered = 0, refused = 0, with_tools = 0, with_results = 0, thinking_rows = 0;
  int effort_max = 0, reminders = 0, encoder_tests = 0;
  int tasks = 0;  // rendered with a quick-instruction task's token (V4)
};

// Renders every "render" row of an encoder fixture (tools/gen_dsv*_chat_fixtures.py) with `t`:
// the encoder's text byte for byte, or an InvalidArgument where the encoder raised. Tool results
// are counted by `result_marker`, the way the variant writes them.
EncoderFixtureRun render_encoder_fixture(const ChatTemplate& t, const std::string& file,
                                         const std::string& result_marker) {
  EncoderFixtureRun run;
  std::istringstream in(testing::read_all(std::string(testing::kDataDir) + "/" + file));
  size_t i = 0;
  for (std::string line; std::getline(in, line); ++i) {
    const auto row = nlohmann::ordered_json::parse(line);  // the tools' key order matters
    if (row["kind"] != "render") continue;
    auto msgs = parse_messages_json(row["messages"].dump());
    EXPECT_TRUE(msgs.ok()) << msgs.status().to_string();
    auto tools = parse_tools_json(row["tools"].dump());
    EXPECT_TRUE(tools.ok()) << tools.status().to_string();
    if (!msgs.ok() || !tools.ok()) continue;
    const bool thinking = row["thinking"].get<bool>();
    const std::string effort =
        row.contains("reasoning_effort") && !row["reasoning_effort"].is_null()
            ? row["reasoning_effort"].get<std::string>()
            : "";
    auto text = t.render(*msgs, /*add_generation_prompt=*/true, *tools, thinking, effort);
    const auto& want = row["expected"];
    if (want.is_object()) {  // the encoder raised
      EXPECT_FALSE(text.ok()) << file << " row " << i << ": the encoder refused ("
                              << want["error"].get<std::string>() << ")";
      if (!text.ok()) {
        EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
      }
      ++run.refused;
      continue;
    }
    EXPECT_TRUE(text.ok()) << file << " row " << i << ": " << text.status().to_string();
    if (!text.ok()) continue;
    EXPECT_EQ(*text, want.get<std::string>())
        << file << " row " << i << ": " << row["messages"].dump();
    ++run.rendered;
    run.with_tools += !tools->empty();
    run.with_results += text->find(result_marker) != std::string::npos;
    run.thinking_rows += thinking;
    run.effort_max += text->find("Reasoning Effort: Absolute maximum") != std::string::npos;
    run.reminders += text->find("<｜latest_reminder｜>") != std::string::npos;
    for (std::string_view token : {"<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>",
                                   "<｜title｜>", "<｜read_url｜>"}) {
      if (text->find(token) != std::string::npos) {
        ++run.tasks;
        break;
      }
    }
    run.encoder_tests += row.value("source", "").starts_with("encoder test");
  }
  return run;
}

// DeepSeek-V3.2 (no Jinja template) against DeepSeek's own encoder, encoding_dsv32.py, on
// tools/gen_dsv32_chat_fixtures.py's conversations as SGLang's server prepares them: the same
// text, or an error where the encoder raises; thinking off and on.
TEST(ChatTemplate, V32MatchesDeepSeeksEncoderOnEveryFixtureConversation) {
  const Tokenizer& tok = testing::deepseek_v3();
  const ChatTemplate t =
      ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekV3_2, tok.bos_token());
  EXPECT_FALSE(t.reasons(false));
  EXPECT_TRUE(t.reasons(true));
  EXPECT_TRUE(t.generation_opens_think(true));
  EXPECT_FALSE(t.generation_opens_think(false));
  const EncoderFixtureRun run = render_encoder_fixture(t, "chat_dsv32.jsonl", "<function_results>");
  std::printf("[ v3.2 ] %d rendered equal to encoding_dsv32.py, %d refused as it refuses\n",
              run.rendered, run.refused);
  EXPECT_GE(run.rendered, 150);
  EXPECT_GE(run.refused, 20);
  EXPECT_GE(run.with_tools, 50);
  EXPECT_GE(run.with_results, 30);
  EXPECT_GE(run.thinking_rows, 60);
}

// DeepSeek-V4 (no Jinja template) against DeepSeek's own encoder, encoding_dsv4.py, on
// tools/gen_dsv4_chat_fixtures.py's conversations (V3.2's, V4's own cases and the encoder's
// four test inputs) prepared as for V3.2: the same text, or an error where the encoder raises;
// thinking off and on, reasoning_effort none, "high", "max" and refused values.
TEST(ChatTemplate, V4MatchesDeepSeeksEncoderOnEveryFixtureConversation) {
  const Tokenizer& tok = testing::deepseek_v3();
  const ChatTemplate t =
      ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekV4, tok.bos_token());
  EXPECT_TRUE(t.hybrid());
  EXPECT_FALSE(t.reasons(false));
  EXPECT_TRUE(t.reasons(true));
  EXPECT_TRUE(t.generation_opens_think(true));
  EXPECT_FALSE(t.generation_opens_think(false));
  const EncoderFixtureRun run = render_encoder_fixture(t, "chat_dsv4.jsonl", "<tool_result>");
  std::printf("[ v4 ] %d rendered equal to encoding_dsv4.py, %d refused as it refuses\n",
              run.rendered, run.refused);
  EXPECT_GE(run.rendered, 300);
  EXPECT_GE(run.refused, 15);
  EXPECT_GE(run.with_tools, 100);
  EXPECT_GE(run.with_results, 50);
  EXPECT_GE(run.thinking_rows, 150);
  EXPECT_GE(run.effort_max, 10);
  EXPECT_GE(run.reminders, 5);
  EXPECT_GE(run.tasks, 20);  // every task, encoder test 4's action
  EXPECT_EQ(run.encoder_tests, 4);
}

TEST(ChatMessagesJson, ToolsKeepTheClientsKeyOrderInPythonJsonStyle) {
  // The string holds a quote, a backslash, a newline, U+0001 and a non-ASCII letter.
  auto t = parse_tools_json(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": [0.5, true,
          null, {}], "s": "q\"\\\n\u0001é"}}}])");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->size(), 1u);
  EXPECT_EQ((*t)[0].name, "f");
  EXPECT_EQ((*t)[0].json, R"({"type": "function", "function": {"name": "f", "parameters": )"
                          R"({"z": 1, "a": [0.5, true, null, {}], "s": "q\"\\\n\u0001é"}}})");
  EXPECT_EQ((*t)[0].parameters, R"({"z": 1, "a": [0.5, true, null, {}], "s": "q\"\\\n\u0001é"})");
  EXPECT_EQ((*t)[0].description, "");
  auto d = parse_tools_json(R"([{"type": "function", "function": {"name": "g",
      "description": "Says \"hi\".\n"}}])");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ((*d)[0].description, "Says \"hi\".\n");
  EXPECT_EQ((*d)[0].parameters, "{}");  // none given: a function without parameters
  EXPECT_FALSE(parse_tools_json(R"([{"type": "function"}])").ok());
  EXPECT_FALSE(parse_tools_json("{}").ok());
}

TEST(ChatTemplate, MissingContentIsAnErrorNotACrash) {
  const auto v3 = ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekV3, "<s>");
  std::vector<Message> msgs(1);
  msgs[0].role = "user";
  auto r = v3.render(msgs, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(ChatMessagesJson, ParsesOpenAiShapesAndReportsErrors) {
  auto m = parse_messages_json(R"({"messages": [
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null,
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}]})");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)[0].content, "ab");
  EXPECT_FALSE((*m)[1].content.has_value());
  EXPECT_EQ((*m)[1].tool_calls->at(0).arguments, R"({"x":1})");
  EXPECT_FALSE(parse_messages_json("[{\"content\": \"no role\"}]").ok());
  EXPECT_FALSE(parse_messages_json("not json").ok());
  EXPECT_FALSE(parse_messages_json(R"([{"role": "user", "content": 5}])").ok());
}

}  // namespace
}  // namespace moeserve
