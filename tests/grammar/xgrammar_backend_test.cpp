// XGrammarBackend against the real DeepSeek-V3 tokenizer: masks admit exactly what the grammar
// allows (random walks through the masks always end in JSON that parses and meets the schema),
// special tokens and padding ids never pass, EOS only at the end, bad schemas are clear errors.
#include "grammar/xgrammar_backend.h"

#include <map>
#include <random>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/tool_call_grammar.h"
#include "tokenizer/chat_messages_json.h"

namespace moeserve {
namespace {

using json = nlohmann::json;

constexpr int64_t kModelVocab = 129280;  // DeepSeek-V3's lm_head rows (past the tokenizer's)

const Tokenizer& tokenizer() {
  static const Tokenizer t = [] {
    auto r = Tokenizer::load("assets/tokenizer/deepseek-v3");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return *r;
  }();
  return t;
}

XGrammarBackend& backend() {
  static std::unique_ptr<XGrammarBackend> b = [] {
    auto r = XGrammarBackend::create(tokenizer(), kModelVocab);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return std::move(*r);
  }();
  return *b;
}

struct Mask {
  std::vector<uint32_t> words = std::vector<uint32_t>(size_t((kModelVocab + 31) / 32), ~0u);
  bool allows(int32_t t) const { return (words[size_t(t / 32)] >> (t % 32)) & 1; }
  std::vector<int32_t> allowed() const {
    std::vector<int32_t> v;
    for (int32_t t = 0; t < kModelVocab; ++t) {
      if (allows(t)) v.push_back(t);
    }
    return v;
  }
};

Mask mask_of(TokenConstraint& c) {
  Mask m;
  c.fill_mask(m.words);
  return m;
}

// Walks the grammar with random allowed tokens, leaning towards those that close strings,
// objects and arrays so that walks end; returns the text before EOS.
std::string random_walk(TokenConstraint& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int32_t eos = *tokenizer().eos_id();
  std::vector<int32_t> out;
  for (int step = 0; step < 4000 && !c.ended(); ++step) {
    Mask m = mask_of(c);
    std::vector<int32_t> ok = m.allowed();
    EXPECT_FALSE(ok.empty()) << "no token allowed after " << out.size() << " tokens";
    if (ok.empty()) break;
    std::vector<int32_t> closers;
    for (int32_t t : ok) {
      if (t == eos) continue;
      std::string_view b = *tokenizer().token_bytes(t);
      if (b.size() <= 3 && b.find_first_of("\"}],0123456789") != std::string_view::npos) {
        closers.push_back(t);
      }
    }
    int32_t t;
    if (m.allows(eos) && rng() % 2 == 0) {
      t = eos;
    } else if (!closers.empty() && rng() % 3 != 0) {
      t = closers[rng() % closers.size()];
    } else {
      t = ok[rng() % ok.size()];
    }
    EXPECT_TRUE(c.accept(t)) << "an allowed token was refused: " << t;
    if (t != eos) out.push_back(t);
  }
  EXPECT_TRUE(c.ended()) << "the walk did not end: " << tokenizer().decode(out, false);
  return tokenizer().decode(out, false);
}

TEST(XGrammarBackend, JsonObjectWalksEndInJsonObjects) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    auto c = backend().start({GrammarSpec::Kind::kJsonObject, "", false, std::nullopt});
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    const std::string text = random_walk(**c, seed);
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << "seed " << seed << ": not JSON: " << text;
    EXPECT_TRUE(j.is_object()) << text;
  }
}

constexpr char kPersonSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    "ok": {"type": "boolean"}
  },
  "required": ["name", "age", "ok"],
  "additionalProperties": false
})";

// Checks j against kPersonSchema by hand (no JSON Schema validator in C++ here; the Python
// tests use the jsonschema package on the server's replies).
void expect_person(const json& j, const std::string& text) {
  ASSERT_TRUE(j.is_object()) << text;
  for (const auto& [k, v] : j.items()) {
    EXPECT_TRUE(k == "name" || k == "age" || k == "tags" || k == "ok") << "extra key: " << text;
  }
  ASSERT_TRUE(j.contains("name") && j.contains("age") && j.contains("ok")) << text;
  ASSERT_TRUE(j["name"].is_string()) << text;
  // maxLength counts code points.
  const std::string name = j["name"].get<std::string>();
  int64_t cps = 0;
  for (unsigned char ch : name) cps += (ch & 0xC0) != 0x80;
  EXPECT_LE(cps, 12) << text;
  ASSERT_TRUE(j["age"].is_number_integer()) << text;
  EXPECT_GE(j["age"].get<int64_t>(), 0) << text;
  EXPECT_LE(j["age"].get<int64_t>(), 150) << text;
  EXPECT_TRUE(j["ok"].is_boolean()) << text;
  if (j.contains("tags")) {
    ASSERT_TRUE(j["tags"].is_array()) << text;
    EXPECT_LE(j["tags"].size(), 3u) << text;
    for (const json& t : j["tags"]) {
      EXPECT_TRUE(t == "red" || t == "green" || t == "blue") << text;
    }
  }
}

TEST(XGrammarBackend, SchemaWalksMeetTheSchema) {
  for (bool strict : {true, false}) {
    for (uint64_t seed = 1; seed <= 12; ++seed) {
      auto c = backend().start({GrammarSpec::Kind::kJsonSchema, kPersonSchema, strict, {}});
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      const std::string text = random_walk(**c, seed);
      json j = json::parse(text, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << "not JSON: " << text;
      expect_person(j, text);
    }
  }
}

TEST(XGrammarBackend, SpecialTokensPaddingAndEarlyEosNeverPass) {
  auto c = backend().start({GrammarSpec::Kind::kJsonObject, "", false, std::nullopt});
  ASSERT_TRUE(c.ok());
  const int32_t eos = *tokenizer().eos_id();
  const int32_t user = *tokenizer().token_to_id("<｜User｜>");
  Mask m = mask_of(**c);
  EXPECT_FALSE(m.allows(eos));
  EXPECT_FALSE(m.allows(user));
  for (int32_t t = tokenizer().vocab_size(); t < kModelVocab; ++t) ASSERT_FALSE(m.allows(t));
  // The first token must open an object (after optional whitespace).
  const int32_t brace = tokenizer().encode("{", false).at(0);
  const int32_t letter = tokenizer().encode("a", false).at(0);
  EXPECT_TRUE(m.allows(brace));
  EXPECT_FALSE(m.allows(letter));
  EXPECT_FALSE((*c)->accept(letter)) << "a refused token must be refused by accept() too";
  EXPECT_TRUE((*c)->accept(brace));
  const int32_t close = tokenizer().encode("}", false).at(0);
  EXPECT_TRUE((*c)->accept(close));
  m = mask_of(**c);
  EXPECT_TRUE(m.allows(eos)) << "EOS may come once the object is closed";
  EXPECT_FALSE(m.allows(brace));
  EXPECT_FALSE((*c)->ended());
  EXPECT_TRUE((*c)->accept(eos));
  EXPECT_TRUE((*c)->ended());
}

TEST(XGrammarBackend, StartsAfterTheGivenToken) {
  const int32_t end_think = *tokenizer().token_to_id("</think>");
  auto c = backend().start({GrammarSpec::Kind::kJsonObject, "", false, end_think});
  ASSERT_TRUE(c.ok());
  Mask m;
  EXPECT_FALSE((*c)->fill_mask(m.words)) << "nothing is masked while the model reasons";
  const int32_t letter = tokenizer().encode("a", false).at(0);
  EXPECT_TRUE((*c)->accept(letter));
  EXPECT_TRUE((*c)->accept(end_think));
  m = mask_of(**c);
  EXPECT_FALSE(m.allows(letter));
  EXPECT_TRUE(m.allows(tokenizer().encode("{", false).at(0)));
}

TEST(XGrammarBackend, BadSchemasAreClearErrors) {
  Status st = backend().check({GrammarSpec::Kind::kJsonSchema, "{not json", false, {}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("schema"), std::string::npos) << st.to_string();
  st = backend().check({GrammarSpec::Kind::kJsonSchema,
                        R"({"type": "integer", "minimum": 5, "maximum": 1})",
                        false,
                        {}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_TRUE(backend().check({GrammarSpec::Kind::kJsonSchema, kPersonSchema, true, {}}).ok());
}

// Tool calls under the grammars of server/tool_call_grammar.h, for each of DeepSeek's call
// syntaxes: random walks through the masks, after the prompt's prefill, always parse into calls
// of the request's tools whose arguments meet their parameters (the named tool only, one call
// when parallel calls are off); a thinking model's walk thinks first.
// "now" takes no parameters: any object, which a random walk of DSML parameters (free names,
// free values) does not end; there it takes none at all.
std::vector<ToolDefinition> weather_tools(ToolCallSyntax syntax) {
  const std::string now = syntax == ToolCallSyntax::kDsml
                              ? R"({"type": "function", "function": {"name": "now", "parameters":
                                   {"type": "object", "properties": {},
                                    "additionalProperties": false}}})"
                              : R"({"type": "function", "function": {"name": "now"}})";
  auto r = parse_tools_json(R"([
      {"type": "function", "function": {"name": "get_weather", "strict": true, "parameters":
        {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lima"]},
         "days": {"type": "integer", "minimum": 1, "maximum": 9}},
         "required": ["city"], "additionalProperties": false}}}, )" +
                            now + "]");
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<ToolDefinition>();
}

void expect_valid_calls(const ParsedToolCalls& parsed, std::optional<std::string_view> named,
                        bool parallel, const std::string& text) {
  ASSERT_FALSE(parsed.calls.empty()) << text;
  if (!parallel) EXPECT_EQ(parsed.calls.size(), 1u) << text;
  for (const ParsedToolCall& c : parsed.calls) {
    if (named) EXPECT_EQ(c.name, *named) << text;
    ASSERT_TRUE(c.name == "get_weather" || c.name == "now") << text;
    const json args = json::parse(c.arguments, nullptr, false);
    ASSERT_TRUE(args.is_object()) << c.arguments << " in " << text;
    if (c.name != "get_weather") continue;
    ASSERT_TRUE(args.contains("city")) << text;
    EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Lima") << text;
    for (const auto& [k, v] : args.items()) EXPECT_TRUE(k == "city" || k == "days") << text;
    if (args.contains("days")) {
      EXPECT_TRUE(args["days"].is_number_integer() && args["days"] >= 1 && args["days"] <= 9)
          << text;
    }
  }
}

TEST(XGrammarBackend, ForcedToolCallWalksParseIntoValidCalls) {
  for (ToolCallSyntax syntax :
       {ToolCallSyntax::kV3, ToolCallSyntax::kV3_1, ToolCallSyntax::kDsml}) {
    const ToolCallFormat f = tool_call_format(syntax);
    for (std::optional<std::string_view> named :
         {std::optional<std::string_view>(), std::optional<std::string_view>("get_weather")}) {
      for (bool parallel : {true, false}) {
        std::set<size_t> counts;
        for (uint64_t seed = 1; seed <= 6; ++seed) {
          const GrammarSpec g = forced_call_grammar(weather_tools(syntax), f, named, parallel);
          auto c = backend().start(g);
          ASSERT_TRUE(c.ok()) << c.status().to_string();
          const std::string text = tool_call_prefill(named, syntax) + random_walk(**c, seed);
          const ParsedToolCalls parsed = parse_tool_calls(text, std::nullopt, syntax);
          expect_valid_calls(parsed, named, parallel && !named, text);
          EXPECT_EQ(parsed.content, "") << text;
          counts.insert(parsed.calls.size());
        }
        if (parallel && !named) {
          EXPECT_GT(*counts.rbegin(), 1u)
              << "no walk made parallel calls (syntax " << int(syntax) << ")";
        }
      }
    }
  }
}

TEST(XGrammarBackend, TriggeredToolCallWalksParseIntoValidCalls) {
  for (ToolCallSyntax syntax :
       {ToolCallSyntax::kV3, ToolCallSyntax::kV3_1, ToolCallSyntax::kDsml}) {
    const ToolCallFormat f = tool_call_format(syntax);
    // A forced call of a thinking model: the thinking (its budget forces </think>), then calls.
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const GrammarSpec g = triggered_call_grammar(weather_tools(syntax), f, std::nullopt, true,
                                                   /*at_least_one=*/true, ThinkingBudget{8});
      auto c = backend().start(g);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      const std::string text = random_walk(**c, seed);
      const size_t end_think = text.find("</think>");
      ASSERT_NE(end_think, std::string::npos) << text;
      const ParsedToolCalls parsed =
          parse_tool_calls(text.substr(end_think + 8), std::nullopt, syntax);
      expect_valid_calls(parsed, std::nullopt, true, text);
    }
    // `auto`: text, and where the model opens a block, valid calls. Walked from the trigger on
    // (a random walk would rarely write it): the trigger's tokens are accepted first.
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const GrammarSpec g =
          triggered_call_grammar(weather_tools(syntax), f, std::nullopt, false, false);
      auto c = backend().start(g);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      const std::string opening = "Let me check." + f.calls_begin;
      for (int32_t t : tokenizer().encode(opening, false)) ASSERT_TRUE((*c)->accept(t)) << t;
      const std::string text = opening + random_walk(**c, seed);
      const ParsedToolCalls parsed = parse_tool_calls(text, std::nullopt, syntax);
      expect_valid_calls(parsed, std::nullopt, false, text);
      EXPECT_EQ(parsed.content.substr(0, 13), "Let me check.") << text;
    }
  }
  EXPECT_FALSE(
      backend().check({GrammarSpec::Kind::kStructuralTag, R"({"type": "nope"})", false, {}}).ok());
}

}  // namespace
}  // namespace moeserve
