// The router's balancers on hand-made loads (docs/pd.md "Balancers") and the router/unit
// messages (pd_protocol.h): round trips keep every bit, malformed bodies are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "router/balancers.h"
#include "router/pd_protocol.h"

namespace moeserve {
namespace {

RankLoad prefill_load(int64_t tokens, double attention = -1) {
  RankLoad l;
  l.input_tokens = tokens;
  l.attention = attention < 0 ? attention_work(tokens, 0) : attention;
  return l;
}

TEST(Balancers, AttentionWorkCountsEveryPairOnce) {
  EXPECT_EQ(attention_work(1, 0), 1);
  EXPECT_EQ(attention_work(4, 0), 10);   // 1 + 2 + 3 + 4
  EXPECT_EQ(attention_work(2, 10), 23);  // 11 + 12
  EXPECT_EQ(attention_work(0, 100), 0);
}

TEST(Balancers, PrefillGoesWhereTheInputTokensAndAttentionAreLeast) {
  std::vector<RankLoad> ranks = {prefill_load(3000), prefill_load(500), prefill_load(1200)};
  auto p = choose_prefill(ranks, {}, 256);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->rank, 1u);
  EXPECT_FALSE(p->by_cache);
  // Equal tokens: the rank whose queued work is many short prompts (less attention) wins.
  ranks = {prefill_load(4000, attention_work(4000, 0)),
           prefill_load(4000, 40 * attention_work(100, 0))};
  EXPECT_EQ(choose_prefill(ranks, {}, 512)->rank, 1u);
  // Not accepting: never chosen; none accepting: no choice.
  ranks = {prefill_load(0), prefill_load(9000)};
  ranks[0].accepting = false;
  EXPECT_EQ(choose_prefill(ranks, {}, 10)->rank, 1u);
  ranks[1].accepting = false;
  EXPECT_FALSE(choose_prefill(ranks, {}, 10));
}

TEST(Balancers, PrefillPrefersTheLongestCachedPrefixWithinTheSlack) {
  // Rank 0 holds 1,920 of the 2,048 prompt tokens and is a little busier than rank 1.
  std::vector<RankLoad> ranks = {prefill_load(1500), prefill_load(1000)};
  std::vector<int64_t> cached = {1920, 0};
  auto p = choose_prefill(ranks, cached, 2048, 0.25);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->rank, 0u);
  // Far busier: the balance wins over the cache.
  ranks = {prefill_load(20000), prefill_load(1000)};
  cached = {256, 0};
  p = choose_prefill(ranks, cached, 2048, 0.25);
  EXPECT_EQ(p->rank, 1u);
  EXPECT_FALSE(p->by_cache);
  // The same loads with no slack at all: strictly by score.
  ranks = {prefill_load(1100), prefill_load(1000)};
  cached = {64, 0};
  p = choose_prefill(ranks, cached, 2048, 0.0);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->rank, ranks[0].input_tokens + 2048 - 64 < ranks[1].input_tokens + 2048 ? 0u : 1u);
  // A cached prefix never counts the whole prompt (the last token is always computed).
  ranks = {prefill_load(0), prefill_load(0)};
  cached = {4096, 0};
  EXPECT_EQ(choose_prefill(ranks, cached, 64)->rank, 0u);
}

// Skewed traffic (prompt lengths 32..8,000): the prefill balancer keeps the heaviest rank's
// input tokens and attention near the mean where round-robin does not.
TEST(Balancers, PrefillBalancerBeatsRoundRobinOnSkewedTraffic) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> len(6.0, 1.3);
  const int R = 4;
  std::vector<RankLoad> balanced(R), rr(R);
  for (int i = 0; i < 400; ++i) {
    const int64_t n = std::clamp<int64_t>(int64_t(len(rng)), 32, 8000);
    const size_t b = choose_prefill(balanced, {}, n)->rank;
    balanced[b].input_tokens += n;
    balanced[b].attention += attention_work(n, 0);
    rr[size_t(i % R)].input_tokens += n;
    rr[size_t(i % R)].attention += attention_work(n, 0);
  }
  auto max_over_mean = [](const std::vector<RankLoad>& v, auto field) {
    double mx = 0, sum = 0;
    for (const RankLoad& l : v) {
      mx = std::max(mx, double(field(l)));
      sum += double(field(l));
    }
    return mx / (sum / double(v.size()));
  };
  auto tokens = [](const RankLoad& l) { return l.input_tokens; };
  auto attn = [](const RankLoad& l) { return l.attention; };
  EXPECT_LT(max_over_mean(balanced, tokens), 1.05);
  EXPECT_LT(max_over_mean(balanced, attn), 1.15);
  EXPECT_GT(max_over_mean(rr, attn), max_over_mean(balanced, attn));
}

TEST(Balancers, DecodeEqualizesRequestsAmongRanksWithRoom) {
  auto d = [](int64_t requests, int64_t used, int64_t total = 100) {
    RankLoad l;
    l.requests = requests;
    l.kv_used = used;
    l.kv_total = total;
    return l;
  };
  EXPECT_EQ(*choose_decode(std::vector<RankLoad>{d(5, 10), d(3, 60), d(4, 5)}, 4), 1u);
  // Equal requests: the lower KV usage.
  EXPECT_EQ(*choose_decode(std::vector<RankLoad>{d(3, 60), d(3, 20)}, 4), 1u);
  // No room for 50 blocks on the emptier one: the one with room, however many requests.
  EXPECT_EQ(*choose_decode(std::vector<RankLoad>{d(1, 70), d(9, 10)}, 50), 1u);
  // Nobody has room: the least used (it queues there).
  EXPECT_EQ(*choose_decode(std::vector<RankLoad>{d(1, 90), d(9, 80)}, 50), 1u);
  std::vector<RankLoad> none = {d(0, 0)};
  none[0].accepting = false;
  EXPECT_FALSE(choose_decode(none, 1));
}

TEST(PdProtocol, RequestsAndOutputsRoundTripBitForBit) {
  PdRequest p;
  p.request.id = "chatcmpl-1-0";
  p.request.prompt = {0, 5, 129279};
  p.request.max_tokens = 77;
  p.request.sampling = {0.7f, 0.9f, 40};
  p.request.seed = 0xffffffffffffffffull;
  p.request.ignore_eos = true;
  p.request.stop_token_ids = {1, 2};
  p.request.logprobs = true;
  p.request.top_logprobs = 5;
  p.transfer = "10.0.0.2:4000";
  p.handle = "chatcmpl-1-0";
  auto back = pd_request_from_json(nlohmann::json::parse(to_json(p).dump()));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->request, p.request);
  EXPECT_EQ(back->transfer, p.transfer);
  EXPECT_EQ(back->handle, p.handle);
  // With logit adjustments (kernels/sampling.h).
  p.request.sampling.min_p = 0.05f;
  p.request.sampling.presence_penalty = -1.25f;
  p.request.sampling.frequency_penalty = 0.3f;
  p.request.sampling.repetition_penalty = 1.1f;
  p.request.sampling.logit_bias = {{3, -100.0f}, {129279, 0.1f}};
  back = pd_request_from_json(nlohmann::json::parse(to_json(p).dump()));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->request, p.request);
  // With a grammar (docs/structured-outputs.md), of either kind.
  p.request.grammar =
      GrammarSpec{GrammarSpec::Kind::kJsonSchema, R"({"type": "integer"})", true, 128799};
  back = pd_request_from_json(nlohmann::json::parse(to_json(p).dump()));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->request, p.request);
  p.request.grammar =
      GrammarSpec{GrammarSpec::Kind::kStructuralTag,
                  R"({"type": "structural_tag", "format": {"type": "const_string", "value": "x"}})",
                  false, std::nullopt};
  back = pd_request_from_json(nlohmann::json::parse(to_json(p).dump()));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->request, p.request);
  p.request.grammar = GrammarSpec{};
  back = pd_request_from_json(nlohmann::json::parse(to_json(p).dump()));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->request, p.request);
  // A keyed request (docs/fault-tolerance.md) and what its client had before the decode unit.
  p.request.idempotency_key = "key-1";
  p.before.emplace();
  p.before->tokens = {GeneratedToken{7, -0.5f, {{7, -0.5f}, {9, -1.25f}}}};
  back = pd_request_from_json(nlohmann::json::parse(to_json(p).dump()));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->request, p.request);
  ASSERT_TRUE(back->before.has_value());
  ASSERT_EQ(back->before->tokens.size(), 1u);
  EXPECT_EQ(back->before->tokens[0].id, 7);
  EXPECT_EQ(back->before->tokens[0].top.size(), 2u);
  nlohmann::json bad_before = to_json(p);
  bad_before["before"] = 5;
  EXPECT_FALSE(pd_request_from_json(bad_before).ok());
  p.before.reset();
  nlohmann::json bad_kind = to_json(p);
  bad_kind["grammar"]["kind"] = "regex";
  EXPECT_FALSE(pd_request_from_json(bad_kind).ok());

  std::mt19937 rng(3);
  RequestOutput o;
  for (int i = 0; i < 200; ++i) {
    GeneratedToken t;
    t.id = int32_t(rng() % 129280);
    uint32_t bits = rng() & 0xbfffffff;  // finite floats of every magnitude, both signs
    std::memcpy(&t.logprob, &bits, 4);
    t.top = {{7, -0.1f}, {9, std::nextafter(-0.1f, -1.0f)}};
    o.tokens.push_back(t);
  }
  o.prompt_tokens = 12;
  o.cached_prompt_tokens = 64;
  o.finished = true;
  o.finish_reason = FinishReason::kHandedOff;
  PrefillReply r{o, "h:1", "id"};
  auto rb = prefill_reply_from_json(nlohmann::json::parse(to_json(r).dump()));
  ASSERT_TRUE(rb.ok()) << rb.status().to_string();
  EXPECT_EQ(rb->output, o);
  EXPECT_EQ(rb->transfer, "h:1");
  // A hand-off without its address is refused.
  r.transfer.clear();
  EXPECT_FALSE(prefill_reply_from_json(nlohmann::json::parse(to_json(r).dump())).ok());

  RequestOutput err;
  err.finished = true;
  err.finish_reason = FinishReason::kError;
  err.error = NotFound("no hand-off 'x'");
  auto eb = request_output_from_json(to_json(err));
  ASSERT_TRUE(eb.ok());
  EXPECT_EQ(eb->finish_reason, FinishReason::kError);
  EXPECT_NE(eb->error.message().find("no hand-off 'x'"), std::string::npos);
}

TEST(PdProtocol, MalformedBodiesAreRefusedWithTheField) {
  EXPECT_FALSE(parse_json("[1,2]", "x").ok());
  EXPECT_FALSE(parse_json("{", "x").ok());
  auto missing = pd_request_from_json(nlohmann::json{{"id", "a"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("prompt"), std::string::npos);
  auto typed = pd_request_from_json(nlohmann::json{{"id", "a"}, {"prompt", "text"}});
  ASSERT_FALSE(typed.ok());
  EXPECT_NE(typed.status().message().find("wrong type"), std::string::npos);
  UnitInfo u{"h:1", "http://h:1", UnitRole::kPrefill, "h:2", 0xabc, 1, 10};
  auto ub = unit_info_from_json(to_json(u));
  ASSERT_TRUE(ub.ok());
  EXPECT_EQ(ub->fingerprint, 0xabcu);
  nlohmann::json j = to_json(u);
  j["transfer"] = "";
  EXPECT_FALSE(unit_info_from_json(j).ok());  // a prefill unit without its transfer server
  j = to_json(u);
  j["role"] = "oracle";
  EXPECT_FALSE(unit_info_from_json(j).ok());
  j = to_json(u);
  j["fingerprint"] = "xyz";
  EXPECT_FALSE(unit_info_from_json(j).ok());
  auto out = request_output_from_json(nlohmann::json{{"tokens", {{{"id", 1}}}},
                                                     {"finished", false},
                                                     {"prompt_tokens", 1},
                                                     {"cached_prompt_tokens", 0}});
  EXPECT_FALSE(out.ok());
}

}  // namespace
}  // namespace moeserve
