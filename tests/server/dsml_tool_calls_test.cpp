// DeepSeek-V3.2's DSML tool calls (ToolCallSyntax::kDsml) against DeepSeek's own parser,
// encoding_dsv32.py's parse_message_from_completion_text, on the assistant turns of
// tests/data/tokenizer/chat_dsv32.jsonl (tools/gen_dsv32_chat_fixtures.py): the reasoning
// splitter and the tool-call parser, as the server chains them, give the encoder's reasoning,
// content and calls for the text whole, cut at every point, and cut at random into many
// pieces; then the cases the encoder refuses and moeserve keeps what it can of. DeepSeek-V4's
// (kDsmlV4, <｜DSML｜tool_calls>) likewise against encoding_dsv4.py on chat_dsv4.jsonl.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/reasoning_splitter.h"
#include "server/tool_call_parser.h"

namespace moeserve {
namespace {

struct Turn {
  std::string reasoning, content;
  std::vector<ParsedToolCall> calls;
};

// The server's chain for one choice: the reasoning splitter (thinking mode: the prompt opened
// <think>), then the tool-call parser on the content; calls rebuilt from their deltas.
Turn stream(const std::vector<std::string_view>& pieces, bool thinking,
            std::optional<int64_t> max_calls = std::nullopt, std::string_view prefill = {},
            ToolCallSyntax syntax = ToolCallSyntax::kDsml) {
  std::optional<ReasoningSplitter> reasoning;
  if (thinking) reasoning.emplace(/*starts_in_reasoning=*/true);
  ToolCallParser tools(max_calls, syntax);
  Turn out;
  auto take = [&](ToolCallParser::Parts p) {
    out.content += p.content;
    for (ToolCallDelta& d : p.calls) {
      if (d.opens) {
        EXPECT_EQ(d.index, int64_t(out.calls.size()));
        out.calls.push_back({d.type, d.name, d.arguments});
      } else {
        EXPECT_FALSE(d.arguments.empty()) << "an argument delta without arguments";
        ASSERT_EQ(d.index, int64_t(out.calls.size()) - 1) << "arguments of a call not open";
        out.calls.back().arguments += d.arguments;
      }
    }
  };
  take(tools.push(prefill));
  auto feed = [&](ReasoningSplitter::Parts p) {
    out.reasoning += p.reasoning;
    take(tools.push(p.content));
  };
  for (std::string_view piece : pieces) {
    if (reasoning) {
      feed(reasoning->push(piece));
    } else {
      take(tools.push(piece));
    }
  }
  if (reasoning) feed(reasoning->finish());
  take(tools.finish());
  EXPECT_EQ(tools.calls(), int64_t(out.calls.size()));
  return out;
}

struct Row {
  std::string text;
  bool thinking;
  Turn want;
};

std::vector<Row> encoder_rows(const char* path = "tests/data/tokenizer/chat_dsv32.jsonl") {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good());
  std::vector<Row> rows;
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "parse") continue;
    Row r{j["text"], j["thinking"], {}};
    const auto& e = j["expected"];
    r.want.reasoning = e["reasoning_content"];
    r.want.content = e["content"];
    for (const auto& c : e["tool_calls"])
      r.want.calls.push_back({"function", c["name"], c["arguments"]});
    rows.push_back(std::move(r));
  }
  return rows;
}

std::string describe(const Turn& t) {
  std::string s = "reasoning=[" + t.reasoning + "] content=[" + t.content + "]";
  for (const ParsedToolCall& c : t.calls) s += " " + c.name + c.arguments;
  return s;
}

bool same(const Turn& a, const Turn& b) {
  return a.reasoning == b.reasoning && a.content == b.content && a.calls == b.calls;
}

TEST(DsmlToolCalls, EveryCutOfTheEncodersTurnsParsesAsTheEncoderParses) {
  const std::vector<Row> rows = encoder_rows();
  ASSERT_GE(rows.size(), 100u);
  int64_t runs = 0, calls = 0, thinking = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const std::string_view t = r.text;
    const Turn whole = stream({t}, r.thinking);
    ASSERT_TRUE(same(whole, r.want)) << "row " << i << "\n got: " << describe(whole)
                                     << "\nwant: " << describe(r.want) << "\ntext: " << r.text;
    for (const ParsedToolCall& c : whole.calls) {  // what every client does with them
      EXPECT_TRUE(nlohmann::json::accept(c.arguments)) << c.arguments;
    }
    calls += int64_t(whole.calls.size());
    thinking += r.thinking;
    for (size_t k = 0; k <= t.size(); ++k) {
      const Turn got = stream({t.substr(0, k), t.substr(k)}, r.thinking);
      ASSERT_TRUE(same(got, r.want)) << "row " << i << " cut at " << k << ": " << describe(got);
      ++runs;
    }
  }
  std::printf(
      "[ dsml ] %zu turns (%lld in thinking mode, %lld calls), %lld cuts equal to "
      "encoding_dsv32.py\n",
      rows.size(), (long long)thinking, (long long)calls, (long long)runs);
  EXPECT_GE(calls, 100);
  EXPECT_GE(thinking, 30);
}

// DeepSeek-V4: the same syntax in a <｜DSML｜tool_calls> block; every cut into two pieces and
// random cuts into many give encoding_dsv4.py's parse. V3.2's parser leaves V4's block as
// content, and V4's leaves V3.2's.
TEST(DsmlToolCalls, V4TurnsParseAsDeepSeeksV4EncoderParsesThem) {
  const std::vector<Row> rows = encoder_rows("tests/data/tokenizer/chat_dsv4.jsonl");
  ASSERT_GE(rows.size(), 100u);
  constexpr auto kV4 = ToolCallSyntax::kDsmlV4;
  std::mt19937_64 rng(4);
  int64_t runs = 0, calls = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const std::string_view t = r.text;
    const Turn whole = stream({t}, r.thinking, std::nullopt, {}, kV4);
    ASSERT_TRUE(same(whole, r.want)) << "row " << i << "\n got: " << describe(whole)
                                     << "\nwant: " << describe(r.want) << "\ntext: " << r.text;
    calls += int64_t(whole.calls.size());
    for (size_t k = 0; k <= t.size(); ++k) {
      const Turn got = stream({t.substr(0, k), t.substr(k)}, r.thinking, std::nullopt, {}, kV4);
      ASSERT_TRUE(same(got, r.want)) << "row " << i << " cut at " << k << ": " << describe(got);
      ++runs;
    }
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<size_t> cuts = {0, t.size()};
      for (int k = int(rng() % 40); k > 0; --k) cuts.push_back(size_t(rng() % (t.size() + 1)));
      std::sort(cuts.begin(), cuts.end());
      std::vector<std::string_view> pieces;
      for (size_t k = 1; k < cuts.size(); ++k)
        pieces.push_back(t.substr(cuts[k - 1], cuts[k] - cuts[k - 1]));
      ASSERT_TRUE(same(stream(pieces, r.thinking, std::nullopt, {}, kV4), r.want)) << "row " << i;
      ++runs;
    }
    if (!r.want.calls.empty()) {
      const Turn v32 = stream({t}, r.thinking);  // V3.2's parser: no calls, the block is content
      EXPECT_TRUE(v32.calls.empty()) << "row " << i;
      EXPECT_NE(v32.content.find("<｜DSML｜tool_calls>"), std::string::npos) << "row " << i;
    }
  }
  std::printf("[ dsml v4 ] %zu turns (%lld calls), %lld cuts equal to encoding_dsv4.py\n",
              rows.size(), (long long)calls, (long long)runs);
  EXPECT_GE(calls, 100);
  for (const Row& r : encoder_rows()) {  // V3.2's turns through V4's parser: no calls
    if (r.want.calls.empty()) continue;
    EXPECT_TRUE(stream({r.text}, r.thinking, std::nullopt, {}, kV4).calls.empty()) << r.text;
  }
}

TEST(DsmlToolCalls, V4FormatAndPrefillNameItsBlock) {
  const ToolCallFormat f = tool_call_format(ToolCallSyntax::kDsmlV4);
  EXPECT_EQ(f.calls_begin, "\n\n<｜DSML｜tool_calls>\n");
  EXPECT_EQ(f.trigger, "<｜DSML｜tool_calls>");
  EXPECT_EQ(f.calls_end, "</｜DSML｜tool_calls>");
  EXPECT_TRUE(f.xml);
  EXPECT_EQ(tool_call_prefill("get", ToolCallSyntax::kDsmlV4),
            "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get\">\n");
  // A forced call: the prefill fed first, then the model's text.
  const Turn forced =
      stream({"<｜DSML｜parameter name=\"q\" string=\"true\">y</｜DSML｜parameter>\n"
              "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"},
             false, std::nullopt, tool_call_prefill("search", ToolCallSyntax::kDsmlV4),
             ToolCallSyntax::kDsmlV4);
  ASSERT_EQ(forced.calls.size(), 1u);
  EXPECT_EQ(forced.calls[0], (ParsedToolCall{"function", "search", R"({"q": "y"})"}));
  EXPECT_EQ(forced.content, "");
  const ParsedToolCalls one = parse_tool_calls(
      "hi\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>",
      std::nullopt, ToolCallSyntax::kDsmlV4);
  EXPECT_EQ(one.content, "hi");
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0], (ParsedToolCall{"function", "a", "{}"}));
}

TEST(DsmlToolCalls, RandomMultiWayCutsParseAsTheEncoderParses) {
  std::mt19937_64 rng(32);
  int64_t runs = 0;
  for (const Row& r : encoder_rows()) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<size_t> cuts = {0, r.text.size()};
      for (int k = int(rng() % 40); k > 0; --k) cuts.push_back(size_t(rng() % (r.text.size() + 1)));
      std::sort(cuts.begin(), cuts.end());
      std::vector<std::string_view> pieces;
      for (size_t k = 1; k < cuts.size(); ++k) {
        pieces.push_back(std::string_view(r.text).substr(cuts[k - 1], cuts[k] - cuts[k - 1]));
      }
      const Turn got = stream(pieces, r.thinking);
      ASSERT_TRUE(same(got, r.want)) << describe(got) << "\ntext: " << r.text;
      ++runs;
    }
  }
  EXPECT_GE(runs, 2000);
}

const std::string kBlock = "\n\n<｜DSML｜function_calls>\n";
const std::string kBlockEnd = "\n</｜DSML｜function_calls>";
std::string invoke(const std::string& name, const std::string& params) {
  return "<｜DSML｜invoke name=\"" + name + "\">\n" + params + "\n</｜DSML｜invoke>";
}
std::string param(const std::string& key, bool is_string, const std::string& value) {
  return "<｜DSML｜parameter name=\"" + key + "\" string=\"" + (is_string ? "true" : "false") +
         "\">" + value + "</｜DSML｜parameter>";
}

TEST(DsmlToolCalls, ArgumentsStreamAsTheyArrive) {
  const std::string text = "Checking." + kBlock +
                           invoke("get_weather", param("city", true, "Pa\"ris\n") + "\n" +
                                                     param("days", false, "[1, 2]")) +
                           kBlockEnd;
  ToolCallParser p(std::nullopt, ToolCallSyntax::kDsml);
  std::vector<std::string> args;
  std::string content;
  for (char c : text) {
    ToolCallParser::Parts parts = p.push(std::string_view(&c, 1));
    content += parts.content;
    for (const ToolCallDelta& d : parts.calls) args.push_back(d.arguments);
  }
  EXPECT_EQ(content, "Checking.");
  std::string joined;
  for (const std::string& a : args) joined += a;
  EXPECT_EQ(joined, R"({"city": "Pa\"ris\n", "days": [1, 2]})");
  // The name with "{", then a piece per parameter part and a byte per value byte as it came.
  EXPECT_GT(args.size(), 10u);
  EXPECT_EQ(args.front(), "{");
}

TEST(DsmlToolCalls, WhatTheEncoderRefusesKeepsWhatItCan) {
  // A nameless call dropped, max_calls, text after the block, a block without "\n\n".
  const std::string two = kBlock + invoke("", param("x", true, "1")) + "\n" +
                          invoke("a", param("x", false, "1")) + "\n" + invoke("b", "") + kBlockEnd +
                          "after";
  ParsedToolCalls all = parse_tool_calls(two, std::nullopt, ToolCallSyntax::kDsml);
  EXPECT_EQ(all.content, "after");
  ASSERT_EQ(all.calls.size(), 2u);
  EXPECT_EQ(all.calls[0], (ParsedToolCall{"function", "a", R"({"x": 1})"}));
  EXPECT_EQ(all.calls[1], (ParsedToolCall{"function", "b", "{}"}));
  EXPECT_EQ(parse_tool_calls(two, 1, ToolCallSyntax::kDsml).calls.size(), 1u);
  ParsedToolCalls bare =
      parse_tool_calls("x<｜DSML｜function_calls>\n" + invoke("f", "") + kBlockEnd, std::nullopt,
                       ToolCallSyntax::kDsml);
  EXPECT_EQ(bare.content, "x");
  ASSERT_EQ(bare.calls.size(), 1u);
  // Cut short (max_tokens) inside a string value: what arrived, escaped.
  ParsedToolCalls cut =
      parse_tool_calls(kBlock + "<｜DSML｜invoke name=\"f\">\n" +
                           "<｜DSML｜parameter name=\"q\" string=\"true\">a\tb</｜DSML",
                       std::nullopt, ToolCallSyntax::kDsml);
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, R"({"q": "a\tb</｜DSML)");
  // No block: all content, including a lone "<｜DSML｜" and trailing newlines.
  const std::string plain = "a <｜DSML｜ b </｜DSML｜invoke>\n\n";
  EXPECT_EQ(parse_tool_calls(plain, std::nullopt, ToolCallSyntax::kDsml).content, plain);
}

TEST(DsmlToolCalls, APrefilledCallCompletesAsTheModelWritesIt) {
  Turn named = stream({"get\">\n", param("q", true, "x"), "\n</｜DSML｜invoke>" + kBlockEnd}, false,
                      std::nullopt, tool_call_prefill(std::nullopt, ToolCallSyntax::kDsml));
  ASSERT_EQ(named.calls.size(), 1u);
  EXPECT_EQ(named.calls[0], (ParsedToolCall{"function", "get", R"({"q": "x"})"}));
  EXPECT_EQ(named.content, "");
  Turn forced = stream({param("q", true, "y"), "\n</｜DSML｜invoke>" + kBlockEnd}, false,
                       std::nullopt, tool_call_prefill("search", ToolCallSyntax::kDsml));
  ASSERT_EQ(forced.calls.size(), 1u);
  EXPECT_EQ(forced.calls[0], (ParsedToolCall{"function", "search", R"({"q": "y"})"}));
}

}  // namespace
}  // namespace moeserve
