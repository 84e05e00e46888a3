// ToolCallParser against the one-shot parse_tool_calls(): the same content and calls for every
// way of cutting the text (all single and pairs of cut points, random multi-way cuts, cuts
// inside the tokens' UTF-8 bytes), and regression tests for bugs seen in other servers' parsers.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "server/tool_call_parser.h"
#include "tool_call_text.h"

namespace moeserve {
namespace {

using testing::call;
using testing::call_v3_1;
using testing::kCallBegin;
using testing::kCallEnd;
using testing::kCallsBegin;
using testing::kCallsEnd;
using testing::kSep;

// Feeds the pieces and rebuilds the calls from the deltas, checking the delta protocol: each
// index opens once, in order, before its arguments; no empty argument-only deltas.
ParsedToolCalls stream(const std::vector<std::string_view>& pieces,
                       std::optional<int64_t> max_calls = std::nullopt,
                       ToolCallSyntax syntax = ToolCallSyntax::kV3) {
  ToolCallParser p(max_calls, syntax);
  ParsedToolCalls out;
  auto take = [&](ToolCallParser::Parts parts) {
    out.content += parts.content;
    for (ToolCallDelta& d : parts.calls) {
      if (d.opens) {
        EXPECT_EQ(d.index, int64_t(out.calls.size()));
        EXPECT_FALSE(d.name.empty());
        out.calls.push_back({d.type, d.name, d.arguments});
      } else {
        EXPECT_FALSE(d.arguments.empty()) << "an argument delta without arguments";
        EXPECT_EQ(d.index, int64_t(out.calls.size()) - 1) << "arguments of a call not open";
        if (d.index >= 0 && d.index < int64_t(out.calls.size())) {
          out.calls[size_t(d.index)].arguments += d.arguments;
        }
      }
    }
  };
  for (std::string_view piece : pieces) take(p.push(piece));
  take(p.finish());
  EXPECT_EQ(p.calls(), int64_t(out.calls.size()));
  return out;
}

void expect_same(const ParsedToolCalls& got, const ParsedToolCalls& want, const std::string& how) {
  EXPECT_EQ(got.content, want.content) << how;
  EXPECT_EQ(got.calls, want.calls) << how;
}

// Texts that exercise every state and transition of the parser.
std::vector<std::string> representative_texts() {
  return {
      "Let me check." + kCallsBegin + call("get_weather", R"({"city": "Paris"})") + kCallsEnd,
      kCallsBegin + call("a", R"({"q": "世界 ｜▁ <｜"})") + "\n" + call("b_2", "{}") + kCallsEnd +
          "after",
      "x < y <｜tool▁calls" + kCallsBegin + kCallBegin + "function" + kSep + "f\n" +
          R"({"fence": "```", "nl": "\n```"})" + kCallEnd + kCallsEnd,
      kCallsBegin + kCallBegin + "function" + kSep + "\n```json\n{}\n```" + kCallEnd +
          call("kept", "[1]") + kCallBegin + "g" + kCallsEnd + "tail" + kCallsBegin +
          call("h", "{\"cut\": tr"),
      "no calls at all, only <｜tool▁call▁end｜> and ``` and <｜ and \n",
  };
}

// The same for DeepSeek-V3.1's syntax: chained calls, fenced arguments (unfenced), a "\n" in a
// name (kept: only the separator ends a V3.1 header), a call cut short before its separator.
std::vector<std::string> representative_texts_v3_1() {
  return {
      "Let me check." + kCallsBegin + call_v3_1("get_weather", R"({"city": "Paris"})") + kCallsEnd,
      kCallsBegin + call_v3_1("a", R"({"q": "世界 ｜▁ <｜"})") + call_v3_1("b_2", "{}") +
          kCallsEnd + "after",
      "x < y <｜tool▁sep" + kCallsBegin + kCallBegin + "f" + kSep + "```json\n{\"n\": 1}\n```" +
          kCallEnd + kCallBegin + "line\nbreak" + kSep + "[]" + kCallEnd + kCallsEnd,
      kCallsBegin + kCallBegin + kSep + "{}" + kCallEnd + call_v3_1("kept", "[1]") + kCallBegin +
          "g" + kCallsEnd + "tail" + kCallsBegin + call_v3_1("h", "{\"cut\": tr"),
      kCallsBegin + kCallBegin + "unfinished_na",
  };
}

// Every cut into two and three pieces, at every byte (inside multi-byte characters too).
TEST(ToolCallParser, EverySingleAndPairOfCutPointsMatchesTheOneShotParse) {
  int64_t runs = 0;
  for (ToolCallSyntax syntax : {ToolCallSyntax::kV3, ToolCallSyntax::kV3_1}) {
    const auto texts =
        syntax == ToolCallSyntax::kV3 ? representative_texts() : representative_texts_v3_1();
    for (const std::string& text : texts) {
      const ParsedToolCalls want = parse_tool_calls(text, std::nullopt, syntax);
      const std::string_view t = text;
      for (size_t i = 0; i <= t.size(); ++i) {
        expect_same(stream({t.substr(0, i), t.substr(i)}, std::nullopt, syntax), want,
                    "cut at " + std::to_string(i));
        ++runs;
        for (size_t j = i; j <= t.size(); ++j) {
          ParsedToolCalls got =
              stream({t.substr(0, i), t.substr(i, j - i), t.substr(j)}, std::nullopt, syntax);
          if (got.content != want.content || got.calls != want.calls) {
            FAIL() << "cuts at " << i << ", " << j << " of: " << text;
          }
          ++runs;
        }
      }
    }
  }
  RecordProperty("runs", std::to_string(runs));
  EXPECT_GT(runs, 80000);
}

// Thousands of random cuts into many pieces, on texts built from random parts.
void random_cuts(ToolCallSyntax syntax) {
  std::mt19937_64 rng(21);
  const std::vector<std::string> parts = {
      kCallsBegin, kCallsEnd, kCallBegin, kCallEnd,    kSep,   "function", "get_weather", "\n",
      "```json\n", "\n```",   "{\"a\":",  " \"世界\"", "}",    "<",        "｜",          "▁",
      "text ",     "<｜tool", "```",      "",          "\n\n", "name_2"};
  int64_t runs = 0;
  for (int text_i = 0; text_i < 400; ++text_i) {
    std::string text;
    const int n_parts = int(rng() % 30);
    for (int k = 0; k < n_parts; ++k) text += parts[rng() % parts.size()];
    if (text_i % 2 == 0 && syntax == ToolCallSyntax::kV3) {  // half: calls around the noise
      text = "pre " + text + kCallsBegin + call("f", "{\"x\": [" + std::to_string(text_i) + "]}") +
             "\n" + call("g", text) + kCallsEnd;
    } else if (text_i % 2 == 0) {
      text = "pre " + text + kCallsBegin +
             call_v3_1("f", "{\"x\": [" + std::to_string(text_i) + "]}") + call_v3_1("g", text) +
             kCallsEnd;
    }
    for (std::optional<int64_t> max_calls : {std::optional<int64_t>(), std::optional<int64_t>(1)}) {
      const ParsedToolCalls want = parse_tool_calls(text, max_calls, syntax);
      for (int rep = 0; rep < 10; ++rep) {
        std::vector<size_t> cuts = {0, text.size()};
        const int n_cuts = int(rng() % 12);
        for (int k = 0; k < n_cuts; ++k) cuts.push_back(size_t(rng() % (text.size() + 1)));
        std::sort(cuts.begin(), cuts.end());
        std::vector<std::string_view> pieces;
        for (size_t k = 1; k < cuts.size(); ++k) {
          pieces.push_back(std::string_view(text).substr(cuts[k - 1], cuts[k] - cuts[k - 1]));
        }
        ParsedToolCalls got = stream(pieces, max_calls, syntax);
        if (got.content != want.content || got.calls != want.calls) {
          FAIL() << "text " << text_i << " rep " << rep << ": " << text;
        }
        ++runs;
      }
    }
  }
  EXPECT_EQ(runs, 8000);
}

TEST(ToolCallParser, RandomMultiWayCutsMatchTheOneShotParse) {
  for (ToolCallSyntax syntax : {ToolCallSyntax::kV3, ToolCallSyntax::kV3_1}) {
    random_cuts(syntax);
    if (HasFatalFailure()) return;
  }
}

// Representative texts 0, 1 and 3 say the same in either syntax.
void expect_shared(const std::vector<std::string>& texts, ToolCallSyntax syntax) {
  ParsedToolCalls a = parse_tool_calls(texts[0], std::nullopt, syntax);
  EXPECT_EQ(a.content, "Let me check.");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0], (ParsedToolCall{"function", "get_weather", R"({"city": "Paris"})"}));
  ParsedToolCalls b = parse_tool_calls(texts[1], std::nullopt, syntax);
  EXPECT_EQ(b.content, "after");
  ASSERT_EQ(b.calls.size(), 2u);
  EXPECT_EQ(b.calls[0].arguments, R"({"q": "世界 ｜▁ <｜"})");
  EXPECT_EQ(b.calls[1], (ParsedToolCall{"function", "b_2", "{}"}));
  EXPECT_EQ(parse_tool_calls(texts[1], 1, syntax).calls.size(), 1u);
  // A nameless call is dropped; g has no arguments; h is cut short.
  ParsedToolCalls d = parse_tool_calls(texts[3], std::nullopt, syntax);
  EXPECT_EQ(d.content, "tail");
  ASSERT_EQ(d.calls.size(), 3u);
  EXPECT_EQ(d.calls[0], (ParsedToolCall{"function", "kept", "[1]"}));
  EXPECT_EQ(d.calls[1], (ParsedToolCall{"function", "g", ""}));
  EXPECT_EQ(d.calls[2], (ParsedToolCall{"function", "h", "{\"cut\": tr"}));
}

TEST(ToolCallParser, OneShotParseOfTheRepresentativeTexts) {
  const auto texts = representative_texts();
  expect_shared(texts, ToolCallSyntax::kV3);
  ParsedToolCalls c = parse_tool_calls(texts[2]);  // no fence: arguments taken as they are
  EXPECT_EQ(c.content, "x < y <｜tool▁calls");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].arguments, R"({"fence": "```", "nl": "\n```"})");
  ParsedToolCalls e = parse_tool_calls(texts[4]);
  EXPECT_EQ(e.content, texts[4]);
  EXPECT_TRUE(e.calls.empty());
}

TEST(ToolCallParser, OneShotParseOfTheV3_1Texts) {
  const auto texts = representative_texts_v3_1();
  const auto parse = [](const std::string& t) {
    return parse_tool_calls(t, std::nullopt, ToolCallSyntax::kV3_1);
  };
  expect_shared(texts, ToolCallSyntax::kV3_1);
  ParsedToolCalls c = parse(texts[2]);  // fenced arguments come out bare
  EXPECT_EQ(c.content, "x < y <｜tool▁sep");
  ASSERT_EQ(c.calls.size(), 2u);
  EXPECT_EQ(c.calls[0], (ParsedToolCall{"function", "f", "{\"n\": 1}"}));
  EXPECT_EQ(c.calls[1], (ParsedToolCall{"function", "line\nbreak", "[]"}));
  ParsedToolCalls e = parse(texts[4]);  // cut short in the name
  ASSERT_EQ(e.calls.size(), 1u);
  EXPECT_EQ(e.calls[0].name, "unfinished_na");
  // The V3 syntax's texts read with V3.1's: the header runs to the separator, so the type
  // "function" is taken as the name (what a server configured for the wrong model would do).
  EXPECT_EQ(parse(representative_texts()[0]).calls.at(0).name, "function");
  // The prefill a forced call puts in the prompt.
  EXPECT_EQ(tool_call_prefill("f", ToolCallSyntax::kV3_1), kCallsBegin + kCallBegin + "f" + kSep);
  EXPECT_EQ(tool_call_prefill(std::nullopt, ToolCallSyntax::kV3_1), kCallsBegin + kCallBegin);
}

// Regression (the V3 parser used on V3.1 text): the arguments of a streamed V3.1 call are its
// JSON, not the name, and the name comes whole.
TEST(ToolCallParser, V3_1ArgumentsStreamAsTheModelWroteThem) {
  ToolCallParser p(std::nullopt, ToolCallSyntax::kV3_1);
  std::string name, args;
  for (std::string piece :
       {kCallsBegin + kCallBegin + "get_", std::string("weather<｜tool"),
        std::string("▁sep｜>{\"city\""), std::string(": \"Paris\"}"), kCallEnd + kCallsEnd}) {
    for (const ToolCallDelta& d : p.push(piece).calls) {
      name += d.name;
      args += d.arguments;
    }
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(args, R"({"city": "Paris"})");
}

// A header that never ends (a model writing on after a "required" prefill) costs linear time:
// each piece is searched once, not the whole held header again.
TEST(ToolCallParser, ALongHeaderIsSearchedOnce) {
  ToolCallParser p;
  p.push(kCallsBegin + kCallBegin + "function" + kSep);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 200000; ++i) EXPECT_TRUE(p.push("name<｜tool").calls.empty());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ToolCallParser::Parts end = p.push("\n{}");
  ASSERT_EQ(end.calls.size(), 1u);
  EXPECT_EQ(end.calls[0].name.size(), 200000u * std::string("name<｜tool").size());
  EXPECT_EQ(end.calls[0].arguments, "{}");
}

// Regression: a parser that looked for the end token only in later pieces lost a call whose
// begin and end tokens came in one piece.
TEST(ToolCallParser, BeginAndEndInOnePieceKeepTheCall) {
  const std::string text = kCallsBegin + call("f", R"({"a": 1})") + kCallsEnd;
  ParsedToolCalls got = stream({text});
  ASSERT_EQ(got.calls.size(), 1u);
  EXPECT_EQ(got.calls[0], (ParsedToolCall{"function", "f", R"({"a": 1})"}));
  EXPECT_EQ(got.content, "");
}

// Regression: a name cut over two pieces was sent as its first half (or not at all).
TEST(ToolCallParser, NameCutOverTwoPiecesIsWhole) {
  const std::string head = kCallsBegin + kCallBegin + "function" + kSep + "get_we";
  ToolCallParser p;
  ToolCallParser::Parts a = p.push(head);
  EXPECT_TRUE(a.calls.empty()) << "a call opened before its name was complete";
  ToolCallParser::Parts b = p.push("ather\n```json\n{\"c");
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_TRUE(b.calls[0].opens);
  EXPECT_EQ(b.calls[0].name, "get_weather");
  EXPECT_EQ(b.calls[0].arguments, "{\"c");  // the arguments so far come with the name
}

// Regression: arguments streamed as "{}" placeholders instead of the model's text.
TEST(ToolCallParser, ArgumentsStreamAsTheModelWroteThem) {
  ToolCallParser p;
  std::string args;
  for (std::string piece :
       {kCallsBegin + kCallBegin + "function" + kSep + "f\n```json\n", std::string("{\"city\""),
        std::string(": \"Paris\"}"), "\n```" + kCallEnd + kCallsEnd}) {
    for (const ToolCallDelta& d : p.push(piece).calls) args += d.arguments;
  }
  EXPECT_EQ(args, R"({"city": "Paris"})");
}

// Regression: a block that opened but held no complete call reported calls (an empty list with
// finish_reason "tool_calls"); here no call is opened, so none is counted.
TEST(ToolCallParser, ABlockWithoutANamedCallOpensNoCall) {
  ParsedToolCalls got = stream({kCallsBegin + kCallBegin + kCallEnd + kCallsEnd});
  EXPECT_TRUE(got.calls.empty());
  ToolCallParser p;
  p.push(kCallsBegin + kCallBegin + "function" + kSep);
  p.finish();
  EXPECT_EQ(p.calls(), 0);
}

// Regression: special tokens leaked into content (a begin token cut over pieces, or the
// block's tail) instead of being consumed.
TEST(ToolCallParser, ContentNeverHoldsTheTokens) {
  const std::string text =
      "Sure." + kCallsBegin + call("f", "{}") + "\n" + call("g", "{}") + kCallsEnd;
  for (size_t i = 0; i <= text.size(); ++i) {
    ParsedToolCalls got =
        stream({std::string_view(text).substr(0, i), std::string_view(text).substr(i)});
    EXPECT_EQ(got.content, "Sure.") << "cut at " << i;
    EXPECT_EQ(got.calls.size(), 2u) << "cut at " << i;
  }
}

}  // namespace
}  // namespace moeserve
