// Constrained decoding in the serving engine (docs/structured-outputs.md), on the trained default
// model with the real tokenizer and XGrammarBackend: every greedy token is the model's best among
// those the grammar allows (until the end of the budget closes it), outputs parse and end at
// EOS within max_tokens, drafts (MTP) and batching change nothing, and requests the engine
// cannot constrain are refused at submit.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "collector.h"
#include "engine/llm_engine.h"
#include "grammar/xgrammar_backend.h"
#include "tokenizer/tokenizer.h"

namespace moeserve {
namespace {

using json = nlohmann::json;
using testing::Collector;

const std::string kModel = std::string(MOESERVE_MODELS_DIR) + "/tiny-py";

const Tokenizer& tokenizer() {
  static const Tokenizer t = *Tokenizer::load(kModel);
  return t;
}

std::shared_ptr<GrammarBackend> backend() {
  static std::shared_ptr<GrammarBackend> b = [] {
    auto r = XGrammarBackend::create(tokenizer(), 129280);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return std::shared_ptr<GrammarBackend>(std::move(*r));
  }();
  return b;
}

EngineOptions options(int64_t drafts = 0) {
  EngineOptions o;
  o.model_dir = kModel;
  o.threads = 2;
  o.kv_cache_gb = 0.05;
  o.kv_dtype = DType::kBF16;
  o.grammar = backend();
  if (drafts > 0) o.speculative = {drafts, /*max_rows=*/0};
  return o;
}

constexpr char kPersonSchema[] = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 20},
  "age": {"type": "integer", "minimum": 0, "maximum": 120},
  "languages": {"type": "array", "items": {"enum": ["python", "c", "rust"]}, "maxItems": 3}},
  "required": ["name", "age", "languages"], "additionalProperties": false})";

EngineRequest request(const std::string& id, const std::string& prompt,
                      std::optional<GrammarSpec> g, int64_t max_tokens = 160) {
  EngineRequest r;
  r.id = id;
  r.prompt = tokenizer().encode(prompt, true);
  r.max_tokens = max_tokens;
  r.grammar = std::move(g);
  r.logprobs = true;
  r.top_logprobs = 20;
  return r;
}

GrammarSpec object_spec() {
  return {GrammarSpec::Kind::kJsonObject, "", false, std::nullopt};
}
GrammarSpec person_spec() {
  return {GrammarSpec::Kind::kJsonSchema, kPersonSchema, true, std::nullopt};
}

std::string text_before_eos(const std::vector<int32_t>& ids) {
  std::vector<int32_t> body(ids);
  if (!body.empty() && body.back() == *tokenizer().eos_id()) body.pop_back();
  return tokenizer().decode(body, false);
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<GeneratedToken> generated;
  FinishReason reason;
};

std::vector<Outcome> run_all(Engine& e, const std::vector<EngineRequest>& reqs) {
  std::vector<Collector> cs(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    Status st = e.submit(reqs[i], cs[i].callback());
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  std::vector<Outcome> out;
  for (Collector& c : cs) {
    c.wait();
    EXPECT_TRUE(c.error.ok()) << c.error.to_string();
    out.push_back({c.tokens, c.generated, c.reason});
  }
  return out;
}

const std::vector<std::string> kPrompts = {"config = ", "def to_json(self):\n    return ",
                                           "# A person as JSON\nperson = "};

TEST(EngineGrammar, GreedyJsonParsesEndsAtEosAndTakesTheBestAllowedToken) {
  auto e = make_engine(options());
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  std::vector<EngineRequest> reqs;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    reqs.push_back(request("obj" + std::to_string(i), kPrompts[i], object_spec()));
    reqs.push_back(request("person" + std::to_string(i), kPrompts[i], person_spec()));
  }
  const std::vector<Outcome> runs = run_all(**e, reqs);
  int64_t generated = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Outcome& r = runs[i];
    generated += int64_t(r.tokens.size());
    const std::string text = text_before_eos(r.tokens);
    // kLength: the end of the budget closed the grammar (the output parses all the same).
    EXPECT_TRUE(r.reason == FinishReason::kStop || r.reason == FinishReason::kLength);
    EXPECT_EQ(r.tokens.back(), *tokenizer().eos_id()) << reqs[i].id << ": " << text;
    EXPECT_LE(int64_t(r.tokens.size()), reqs[i].max_tokens);
    json j = json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << reqs[i].id << ": not JSON: " << text;
    ASSERT_TRUE(j.is_object()) << text;
    if (reqs[i].grammar->kind == GrammarSpec::Kind::kJsonSchema) {
      EXPECT_EQ(j.size(), 3u) << text;
      EXPECT_TRUE(j["name"].is_string() && j["age"].is_number_integer() &&
                  j["languages"].is_array())
          << text;
    }
    // Greedy under a mask: the chosen token's logprob is the highest of the allowed tokens,
    // so no token of the model's top 20 that beats it may be allowed at that point. Replay the
    // grammar to ask it (up to the end guard, where closing tokens are forced).
    auto c = backend()->start(*reqs[i].grammar);
    ASSERT_TRUE(c.ok());
    std::vector<uint32_t> mask(size_t((129280 + 31) / 32));
    const int64_t guard = std::min<int64_t>(48, reqs[i].max_tokens / 2);
    for (size_t k = 0; k < r.generated.size(); ++k) {
      const GeneratedToken& g = r.generated[k];
      std::fill(mask.begin(), mask.end(), ~0u);
      (*c)->fill_mask(mask);
      if (reqs[i].max_tokens - int64_t(k) <= guard) (*c)->narrow_to_end(mask);
      EXPECT_TRUE((mask[size_t(g.id / 32)] >> (g.id % 32)) & 1) << "token " << k;
      for (const TokenLogprob& t : g.top) {
        const bool allowed = (mask[size_t(t.id / 32)] >> (t.id % 32)) & 1;
        if (allowed) EXPECT_LE(t.logprob, g.logprob) << reqs[i].id << ": token " << t.id;
      }
      ASSERT_TRUE((*c)->accept(g.id));
    }
    EXPECT_TRUE((*c)->ended());
    std::printf("[ %s ] %s\n", reqs[i].id.c_str(), text.c_str());
  }
  const EngineStats s = (*e)->stats();
  EXPECT_EQ(s.grammar_tokens, generated);
  EXPECT_GT(s.grammar_ns, 0);
}

TEST(EngineGrammar, BatchingAndDraftsChangeNothing) {
  std::vector<EngineRequest> reqs;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    reqs.push_back(request("person" + std::to_string(i), kPrompts[i], person_spec(), 120));
    reqs.push_back(request("free" + std::to_string(i), kPrompts[i], std::nullopt, 40));
  }
  auto plain = make_engine(options());
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  std::vector<Outcome> alone;
  for (const EngineRequest& r : reqs) alone.push_back(run_all(**plain, {r})[0]);
  const std::vector<Outcome> together = run_all(**plain, reqs);
  auto spec = make_engine(options(/*drafts=*/2));
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  const std::vector<Outcome> drafted = run_all(**spec, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << reqs[i].id;
    EXPECT_EQ(drafted[i].tokens, alone[i].tokens) << reqs[i].id;
    EXPECT_EQ(drafted[i].reason, alone[i].reason) << reqs[i].id;
  }
  const EngineStats s = (*spec)->stats();
  EXPECT_GT(s.spec_verify_steps, 0);
  EXPECT_GT(s.spec_accepted[0], 0) << "drafts were accepted under the grammar too";
}

TEST(EngineGrammar, SampledOutputsFollowTheSchema) {
  auto e = make_engine(options());
  ASSERT_TRUE(e.ok());
  std::vector<EngineRequest> reqs;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    EngineRequest r = request("s" + std::to_string(seed), kPrompts[seed % 3], person_spec(), 200);
    r.sampling.temperature = 1.0f;
    r.seed = seed;
    reqs.push_back(std::move(r));
  }
  for (const Outcome& r : run_all(**e, reqs)) {
    const std::string text = text_before_eos(r.tokens);
    ASSERT_EQ(r.reason, FinishReason::kStop) << text;
    json j = json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    EXPECT_LE(j["age"].get<int64_t>(), 120) << text;
    for (const json& l : j["languages"]) EXPECT_TRUE(l == "python" || l == "c" || l == "rust");
  }
}

TEST(EngineGrammar, RequestsItCannotConstrainAreRefused) {
  EngineOptions o = options();
  o.grammar = nullptr;
  auto bare = make_engine(o);
  ASSERT_TRUE(bare.ok());
  Collector c;
  Status st = (*bare)->submit(request("a", "x = ", object_spec()), c.callback());
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.to_string();

  auto e = make_engine(options());
  ASSERT_TRUE(e.ok());
  EngineRequest r = request("b", "x = ", object_spec());
  r.ignore_eos = true;
  st = (*e)->submit(r, c.callback());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  st = (*e)->submit(
      request("c", "x = ", GrammarSpec{GrammarSpec::Kind::kJsonSchema, "[1,", false, std::nullopt}),
      c.callback());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  // The engine goes on serving.
  const Outcome d = run_all(**e, {request("d", "x = ", object_spec(), 30)})[0];
  EXPECT_EQ(d.tokens.back(), *tokenizer().eos_id());
}

}  // namespace
}  // namespace moeserve
