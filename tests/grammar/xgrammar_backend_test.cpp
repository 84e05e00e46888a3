// XGrammarBackend against the real DeepSeek-V3 tokenizer: masks admit exactly what the grammar
// allows (random walks through the masks always end in JSON that parses and meets the schema),
// special tokens and padding ids never pass, EOS only at the end, bad schemas are clear errors.
#include "grammar/xgrammar_backend.h"

#include <map>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

// A forced tool call: random walks end in one of the calls' prefix (a name and the syntax up to
// its arguments) and then arguments that meet that function's parameters (any object for a
// function without them); a named call (prefix "") is its arguments alone.
TEST(XGrammarBackend, ToolCallWalksEndInACallWithValidArguments) {
  const json weather = {{"type", "object"},
                        {"properties",
                         {{"city", {{"type", "string"}, {"maxLength", 10}}},
                          {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 1000}}}}},
                        {"required", {"city"}}};
  const json calls = json::array(
      {{{"prefix", "get_weather\n```json\n"}, {"parameters", weather}, {"strict", true}},
       {{"prefix", "now\n```json\n"}, {"parameters", nullptr}, {"strict", false}}});
  std::map<std::string, int> seen;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    auto c = backend().start({GrammarSpec::Kind::kToolCall, calls.dump(), false, std::nullopt});
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    const std::string text = random_walk(**c, seed);
    const size_t fence = text.find("\n```json\n");
    ASSERT_NE(fence, std::string::npos) << text;
    const std::string name = text.substr(0, fence);
    ASSERT_TRUE(name == "get_weather" || name == "now") << text;
    ++seen[name];
    const json args = json::parse(text.substr(fence + 9), nullptr, false);
    ASSERT_TRUE(args.is_object()) << text;
    if (name == "get_weather") {
      ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << text;
      for (const auto& [k, v] : args.items()) EXPECT_TRUE(k == "city" || k == "days") << text;
      if (args.contains("days")) EXPECT_TRUE(args["days"].is_number_integer()) << text;
    }
  }
  EXPECT_EQ(seen.size(), 2u) << "the walks never took one of the calls";
  const json named = json::array({{{"prefix", ""}, {"parameters", weather}, {"strict", true}}});
  auto c = backend().start({GrammarSpec::Kind::kToolCall, named.dump(), false, std::nullopt});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const json args = json::parse(random_walk(**c, 99), nullptr, false);
  EXPECT_TRUE(args.is_object() && args.contains("city"));
  // A call list that is not one is a clear error.
  EXPECT_FALSE(backend().check({GrammarSpec::Kind::kToolCall, "[]", false, std::nullopt}).ok());
}

}  // namespace
}  // namespace moeserve
