// Streams that outlive their connection (docs/fault-tolerance.md): every SSE event of a keyed
// stream has an id (the tokens it accounts for), a request sent with an Idempotency-Key is the same
// completion each time (its id and seed follow from the key), and the same request with
// Last-Event-ID gives exactly the events after that one: for every cut of a stream, what the client
// had plus what the resumed stream sends is the whole stream, nothing twice, nothing missing,
// whatever batches the engine delivered the tokens in.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness.h"

namespace moeserve::testing {
namespace {

using json = nlohmann::json;

// What a chat stream says, joined: content, reasoning, finish reasons, role chunks, usage chunks.
struct Said {
  std::string content, reasoning;
  int finishes = 0, roles = 0, usages = 0;
  bool done = false;
};

void add(Said& s, const json& e) {
  if (e == "[DONE]") {
    s.done = true;
    return;
  }
  if (e.contains("usage") && !e["usage"].is_null()) ++s.usages;
  if (e["choices"].empty()) return;
  const json& c = e["choices"][0];
  const json& d = c.contains("delta") ? c["delta"] : json::object();
  if (d.contains("role")) ++s.roles;
  if (d.contains("content") && d["content"].is_string()) s.content += d["content"];
  if (d.contains("reasoning_content")) s.reasoning += d["reasoning_content"];
  if (c.contains("text")) s.content += c["text"];
  if (!c["finish_reason"].is_null()) ++s.finishes;
}

Said said(const std::vector<json>& events) {
  Said s;
  for (const json& e : events) add(s, e);
  return s;
}

// Every cut of a stream resumed: the events up to each id, then the resumed stream.
void expect_every_resume_completes(Harness& h, const std::string& path, const std::string& body,
                                   const std::string& key, int64_t resume_per_step) {
  auto full = h.post(path, body, {{"Idempotency-Key", key}});
  ASSERT_EQ(full->status, 200) << full->body;
  const std::vector<json> events = sse_events(full->body);
  const std::vector<int64_t> ids = sse_ids(full->body);
  ASSERT_EQ(events.size(), ids.size());
  const Said whole = said(events);
  ASSERT_TRUE(whole.done && whole.finishes == 1) << full->body;
  // Ids rise with every event but [DONE], which has none.
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    EXPECT_GE(ids[i], 0) << i;
    if (i > 0) EXPECT_GT(ids[i], ids[i - 1]) << full->body;
  }
  EXPECT_EQ(ids.back(), -1);
  // The resumed request's tokens come in other batches than the first's (another engine, MTP,
  // a hand-off's first token): a cut may fall inside one.
  h.engine.set_tokens_per_step(resume_per_step);
  for (size_t cut = 0; cut + 1 < events.size(); ++cut) {
    auto r =
        h.post(path, body, {{"Idempotency-Key", key}, {"Last-Event-ID", std::to_string(ids[cut])}});
    ASSERT_EQ(r->status, 200) << r->body;
    Said s = said(std::vector<json>(events.begin(), events.begin() + int64_t(cut) + 1));
    for (const json& e : sse_events(r->body)) add(s, e);
    EXPECT_EQ(s.content, whole.content) << "cut after event " << cut << " (id " << ids[cut] << ")";
    EXPECT_EQ(s.reasoning, whole.reasoning) << "cut " << cut;
    EXPECT_EQ(s.finishes, 1) << "cut " << cut;
    EXPECT_EQ(s.roles, whole.roles) << "cut " << cut;
    EXPECT_EQ(s.usages, whole.usages) << "cut " << cut;
    EXPECT_TRUE(s.done) << "cut " << cut;
    // The resumed events carry the ids of the same events in the whole stream.
    const std::vector<int64_t> again = sse_ids(r->body);
    for (size_t k = 0; k + 1 < again.size(); ++k) EXPECT_GT(again[k], ids[cut]) << "cut " << cut;
  }
}

TEST(Resume, EveryCutOfAChatStreamResumesExactly) {
  for (auto [first, again] : {std::pair<int64_t, int64_t>{1, 3}, {3, 2}, {2, 1}}) {
    FakeEngineOptions o = scripted("The quick brown fox jumps over the lazy dog, twice over.");
    o.tokens_per_step = first;
    Harness h(o);
    expect_every_resume_completes(
        h, "/v1/chat/completions",
        R"({"messages":[{"role":"user","content":"Hi"}],"stream":true,)"
        R"("stream_options":{"include_usage":true},"stop":[" lazy dog"]})",
        "key-chat-" + std::to_string(first), again);
  }
}

TEST(Resume, EveryCutOfACompletionAndAReasoningStreamResumesExactly) {
  FakeEngineOptions o = scripted("one two three four five six");
  o.tokens_per_step = 2;
  Harness h(o);
  expect_every_resume_completes(
      h, "/v1/completions", R"({"prompt":"count","max_tokens":5,"stream":true})", "key-cmpl", 3);
  FakeEngineOptions r1 = scripted("Let me see.</think>\n\nIt is 4.");
  r1.tokens_per_step = 2;
  Harness hr(
      r1, {}, {},
      ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekR1, v3_tokenizer().bos_token()));
  expect_every_resume_completes(hr, "/v1/chat/completions",
                                R"({"messages":[{"role":"user","content":"2+2?"}],"stream":true})",
                                "key-r1", 1);
}

// Without an Idempotency-Key a stream cannot be resumed, so its events are `data:` lines alone
// (as OpenAI's, vLLM's and SGLang's: `vllm bench serve` reads every event as `data: {json}`),
// with the same chunks a keyed stream carries.
TEST(Resume, OnlyAKeyedStreamsEventsHaveIds) {
  Harness h(scripted("Hello there, friend."));
  const std::string body = R"({"messages":[{"role":"user","content":"Hi"}],"stream":true})";
  auto plain = h.post("/v1/chat/completions", body);
  auto keyed = h.post("/v1/chat/completions", body, {{"Idempotency-Key", "k-ids"}});
  ASSERT_EQ(plain->status, 200) << plain->body;
  ASSERT_EQ(keyed->status, 200) << keyed->body;
  EXPECT_EQ(plain->body.find("id: "), std::string::npos) << plain->body;
  for (int64_t id : sse_ids(plain->body)) EXPECT_EQ(id, -1) << plain->body;
  const std::vector<int64_t> ids = sse_ids(keyed->body);
  ASSERT_GE(ids.size(), 3u);
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_GE(ids[i], 0) << keyed->body;
  const Said a = said(sse_events(plain->body)), b = said(sse_events(keyed->body));
  EXPECT_EQ(a.content, b.content);
  EXPECT_EQ(a.roles, b.roles);
  EXPECT_EQ(a.finishes, 1);
  EXPECT_TRUE(a.done);
}

TEST(Resume, AKeyMakesTheSameCompletionEachTime) {
  Harness h(scripted("Hello there."));
  const std::string body = R"({"messages":[{"role":"user","content":"Hi"}],"temperature":0.9})";
  auto a = h.post("/v1/chat/completions", body, {{"Idempotency-Key", "k1"}});
  auto b = h.post("/v1/chat/completions", body, {{"Idempotency-Key", "k1"}});
  auto c = h.post("/v1/chat/completions", body, {{"Idempotency-Key", "k2"}});
  auto d = h.post("/v1/chat/completions", body);
  ASSERT_EQ(a->status, 200) << a->body;
  const json ja = json::parse(a->body), jb = json::parse(b->body), jc = json::parse(c->body);
  EXPECT_EQ(ja["id"], jb["id"]);
  EXPECT_NE(ja["id"], jc["id"]);
  EXPECT_EQ(ja["choices"], jb["choices"]);
  // The seed follows from the key (the engine's sampler then repeats itself), unless the request
  // sets one; engine ids stay unique.
  const auto sub = h.engine.submitted();
  ASSERT_EQ(sub.size(), 4u);
  ASSERT_TRUE(sub[0].seed && sub[1].seed && sub[2].seed);
  EXPECT_EQ(*sub[0].seed, *sub[1].seed);
  EXPECT_NE(*sub[0].seed, *sub[2].seed);
  EXPECT_FALSE(sub[3].seed.has_value());
  EXPECT_NE(sub[0].id, sub[1].id);
  // The key travels with the request (a decode unit keeps its outputs under it); a call that may
  // be a retry is looked for at the decode units first, a new stream is not.
  EXPECT_EQ(sub[0].idempotency_key, "k1");
  EXPECT_TRUE(sub[0].attach_first);
  EXPECT_TRUE(sub[3].idempotency_key.empty());
  EXPECT_FALSE(sub[3].attach_first);
  const std::string stream = R"({"messages":[{"role":"user","content":"Hi"}],"stream":true})";
  ASSERT_EQ(h.post("/v1/chat/completions", stream, {{"Idempotency-Key", "k3"}})->status, 200);
  EXPECT_FALSE(h.engine.submitted().back().attach_first);
  ASSERT_EQ(
      h.post("/v1/chat/completions", stream, {{"Idempotency-Key", "k3"}, {"Last-Event-ID", "2"}})
          ->status,
      200);
  EXPECT_TRUE(h.engine.submitted().back().attach_first);
  auto seeded =
      h.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Hi"}],"seed":7})",
             {{"Idempotency-Key", "k1"}});
  ASSERT_EQ(seeded->status, 200);
  EXPECT_EQ(h.engine.submitted().back().seed, std::optional<uint64_t>(7));
}

TEST(Resume, WhatCannotBeResumedIsA400) {
  Harness h(scripted("Hello there."));
  const std::string stream = R"({"messages":[{"role":"user","content":"Hi"}],"stream":true})";
  auto no_key = h.post("/v1/chat/completions", stream, {{"Last-Event-ID", "3"}});
  EXPECT_EQ(no_key->status, 400) << no_key->body;
  auto not_stream =
      h.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Hi"}]})",
             {{"Idempotency-Key", "k"}, {"Last-Event-ID", "3"}});
  EXPECT_EQ(not_stream->status, 400) << not_stream->body;
  auto n2 = h.post("/v1/chat/completions",
                   R"({"messages":[{"role":"user","content":"Hi"}],"stream":true,"n":2})",
                   {{"Idempotency-Key", "k"}, {"Last-Event-ID", "3"}});
  EXPECT_EQ(n2->status, 400) << n2->body;
  for (const char* bad : {"-1", "x", "3.5", "1e3"}) {
    auto r =
        h.post("/v1/chat/completions", stream, {{"Idempotency-Key", "k"}, {"Last-Event-ID", bad}});
    EXPECT_EQ(r->status, 400) << bad << ": " << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["param"], "Last-Event-ID");
  }
  auto long_key =
      h.post("/v1/chat/completions", stream, {{"Idempotency-Key", std::string(300, 'k')}});
  EXPECT_EQ(long_key->status, 400);
}

}  // namespace
}  // namespace moeserve::testing
