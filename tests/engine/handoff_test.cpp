// Prefill/decode hand-off in the serving engine (docs/pd.md): a request prefilled on one engine
// (EngineRequest::hand_off) and continued on another (EngineRequest::resume) gets exactly the
// tokens, logprobs and top logprobs one engine gives it, greedy and sampled, in every KV format;
// a bad hand-off is refused at submit with a message and harms no other request.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <atomic>
#include <map>
#include <thread>

#include "../model/test_models.h"
#include "cache/kv_cache.h"
#include "collector.h"
#include "engine/llm_engine.h"
#include "model/checkpoint.h"

namespace moeserve {
namespace {

using testing::Collector;

EngineOptions options(DType kv, double kv_gb = 0.05) {
  EngineOptions o;
  o.model_dir = kv == DType::kF8E4M3
                    ? testing::small_model_dir("handoff_fp8", "tiny", {"kv_lora_rank=256"})
                    : testing::small_model_dir("handoff", "tiny");
  o.threads = 2;
  o.kv_cache_gb = kv_gb;
  o.max_batch_tokens = 96;  // chunked prefill of the longer prompts
  o.kv_dtype = kv;
  return o;
}

EngineRequest request(const std::string& id, int n_prompt, int salt, int64_t max_tokens,
                      bool sampled) {
  EngineRequest r;
  r.id = id;
  for (int i = 0; i < n_prompt; ++i) r.prompt.push_back((i * 17 + salt * 29 + 3) % 1000);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.top_logprobs = 3;
  if (sampled) {
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.seed = 1234 + uint64_t(salt);
  }
  return r;
}

std::unique_ptr<Engine> engine(const EngineOptions& o) {
  auto e = make_engine(o);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(*e) : nullptr;
}

void run(Engine& e, EngineRequest r, Collector* c) {
  Status st = e.submit(std::move(r), c->callback());
  ASSERT_TRUE(st.ok()) << st.to_string();
  c->wait();
}

// Prefill on p, decode on d: the first token comes from p, the rest from d.
std::vector<GeneratedToken> disaggregated(Engine& p, Engine& d, const EngineRequest& r,
                                          int64_t* cached = nullptr) {
  EngineRequest first = r;
  first.hand_off = true;
  Collector pc;
  run(p, first, &pc);
  EXPECT_EQ(pc.reason, FinishReason::kHandedOff) << r.id;
  EXPECT_EQ(pc.generated.size(), 1u) << r.id;
  if (!pc.handoff) {
    ADD_FAILURE() << r.id << ": no hand-off";
    return pc.generated;
  }
  const KvHandoff& h = *pc.handoff;
  EXPECT_EQ(h.n_prompt, int64_t(r.prompt.size()));
  EXPECT_EQ(h.n_computed, h.n_prompt);
  EXPECT_EQ(h.tokens.size(), r.prompt.size() + 1);
  EXPECT_EQ(int64_t(h.blocks.size()), blocks_for(h.n_computed));
  if (cached) *cached = h.n_cached_prompt;
  EngineRequest rest = r;
  rest.resume = pc.handoff;
  Collector dc;
  run(d, rest, &dc);
  EXPECT_EQ(dc.reason, FinishReason::kLength) << r.id << " " << dc.error.to_string();
  std::vector<GeneratedToken> all = pc.generated;
  all.insert(all.end(), dc.generated.begin(), dc.generated.end());
  return all;
}

void expect_disaggregated_equals_colocated(DType kv) {
  SCOPED_TRACE(fmt::format("KV {}", dtype_name(kv)));
  auto colocated = engine(options(kv));
  auto p = engine(options(kv));
  auto d = engine(options(kv));
  ASSERT_TRUE(colocated && p && d);
  // Prompts inside one block, exactly one block, chunked over several steps; greedy and sampled.
  std::vector<EngineRequest> reqs;
  int salt = 0;
  for (int n : {3, 64, 100, 150}) {
    for (bool sampled : {false, true}) {
      reqs.push_back(request(fmt::format("r{}{}", n, sampled ? "s" : "g"), n, ++salt, 9, sampled));
    }
  }
  for (const EngineRequest& r : reqs) {
    Collector c;
    run(*colocated, r, &c);
    EXPECT_EQ(disaggregated(*p, *d, r), c.generated) << r.id;
  }
  // The prefill engine keeps nothing but cached full blocks; the decode engine nothing at all
  // referenced.
  EXPECT_EQ(p->stats().running, 0);
  EXPECT_EQ(d->stats().running, 0);
}

TEST(Handoff, DisaggregatedEqualsColocatedF32) {
  expect_disaggregated_equals_colocated(DType::kF32);
}
TEST(Handoff, DisaggregatedEqualsColocatedBf16) {
  expect_disaggregated_equals_colocated(DType::kBF16);
}
TEST(Handoff, DisaggregatedEqualsColocatedFp8) {
  expect_disaggregated_equals_colocated(DType::kF8E4M3);
}

// A request that ends with its first token ends on the prefill unit; no hand-off.
// Failover (docs/fault-tolerance.md): decode unit d1 is lost after k tokens; d2 resumes the
// same hand-off with the tokens the client already has (EngineRequest::resume_generated),
// computes their KV itself and goes on: the rest equals one engine's, token for token, logprobs
// included, greedy and sampled (the sampler advanced one draw per token already emitted).
void expect_rebound_equals_colocated(DType kv) {
  SCOPED_TRACE(fmt::format("KV {}", dtype_name(kv)));
  auto colocated = engine(options(kv));
  auto p = engine(options(kv));
  auto d2 = engine(options(kv));
  ASSERT_TRUE(colocated && p && d2);
  int salt = 40;
  for (int n : {5, 64, 130}) {
    for (bool sampled : {false, true}) {
      const EngineRequest r =
          request(fmt::format("f{}{}", n, sampled ? "s" : "g"), n, ++salt, 12, sampled);
      Collector c;
      run(*colocated, r, &c);
      ASSERT_EQ(c.generated.size(), 12u);
      EngineRequest first = r;
      first.hand_off = true;
      Collector pc;
      run(*p, first, &pc);
      ASSERT_TRUE(pc.handoff) << r.id;
      for (size_t k : {size_t(1), size_t(2), size_t(7), size_t(11)}) {  // tokens the client has
        EngineRequest rest = r;
        rest.id = fmt::format("{}-{}", r.id, k);
        rest.resume = pc.handoff;
        for (size_t i = 0; i < k; ++i) rest.resume_generated.push_back(c.generated[i].id);
        Collector dc;
        run(*d2, rest, &dc);
        EXPECT_EQ(dc.reason, FinishReason::kLength) << rest.id << " " << dc.error.to_string();
        const std::vector<GeneratedToken> want(c.generated.begin() + long(k), c.generated.end());
        EXPECT_EQ(dc.generated, want) << rest.id;
      }
      // Tokens that do not begin with the hand-off's are refused at submit.
      EngineRequest bad = r;
      bad.id = r.id + "-bad";
      bad.resume = pc.handoff;
      bad.resume_generated = {c.generated[0].id + 1, c.generated[1].id};
      Collector bc;
      EXPECT_EQ(d2->submit(bad, bc.callback()).code(), StatusCode::kInvalidArgument);
    }
  }
  EXPECT_EQ(d2->stats().running, 0);
}

TEST(Handoff, ReboundAfterALostDecodeUnitEqualsColocatedBf16) {
  expect_rebound_equals_colocated(DType::kBF16);
}
TEST(Handoff, ReboundAfterALostDecodeUnitEqualsColocatedFp8) {
  expect_rebound_equals_colocated(DType::kF8E4M3);
}

TEST(Handoff, RequestEndingAtItsFirstTokenIsNotHandedOff) {
  auto p = engine(options(DType::kBF16));
  ASSERT_TRUE(p);
  EngineRequest r = request("one", 20, 1, 1, false);
  r.hand_off = true;
  Collector c;
  run(*p, r, &c);
  EXPECT_EQ(c.reason, FinishReason::kLength);
  EXPECT_EQ(c.tokens.size(), 1u);
  EXPECT_EQ(c.handoff, nullptr);

  r.id = "stop";
  r.max_tokens = 5;
  r.stop_token_ids = {c.tokens[0]};  // (greedy: the same first token)
  Collector s;
  run(*p, r, &s);
  EXPECT_EQ(s.reason, FinishReason::kStop);
  EXPECT_EQ(s.handoff, nullptr);
}

// Resumed requests on a decode engine with 6 blocks, three of which need 3 each: they wait for
// blocks, preempt each other and recompute, and still get what one engine gives each alone.
TEST(Handoff, ResumedRequestsUnderBlockPressureChangeNothing) {
  const EngineOptions base = options(DType::kBF16);
  auto colocated = engine(base);
  auto p = engine(base);
  auto ck = Checkpoint::open(base.model_dir);
  ASSERT_TRUE(ck.ok());
  EngineOptions small = base;
  small.kv_cache_gb =
      6.0 * double(kv_cache_layout((*ck)->config(), base.kv_dtype).block_bytes()) / 1e9 + 1e-9;
  auto d = engine(small);
  ASSERT_TRUE(colocated && p && d);
  std::vector<EngineRequest> reqs = {request("x", 100, 4, 60, false),
                                     request("y", 100, 5, 60, true),
                                     request("z", 100, 6, 60, false)};
  std::vector<std::vector<GeneratedToken>> alone;
  std::vector<std::shared_ptr<const KvHandoff>> handoffs;
  std::vector<GeneratedToken> firsts;
  for (const EngineRequest& r : reqs) {
    Collector c;
    run(*colocated, r, &c);
    alone.push_back(c.generated);
    EngineRequest first = r;
    first.hand_off = true;
    Collector pc;
    run(*p, first, &pc);
    ASSERT_TRUE(pc.handoff);
    handoffs.push_back(pc.handoff);
    firsts.push_back(pc.generated.at(0));
  }
  std::vector<Collector> cs(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EngineRequest rest = reqs[i];
    rest.resume = handoffs[i];
    ASSERT_TRUE(d->submit(rest, cs[i].callback()).ok());
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    cs[i].wait();
    std::vector<GeneratedToken> all = {firsts[i]};
    all.insert(all.end(), cs[i].generated.begin(), cs[i].generated.end());
    EXPECT_EQ(all, alone[i]) << reqs[i].id;
  }
  EXPECT_GT(d->stats().preemptions, 0);
}

// What a decode engine refuses, each with a message, and a good request after them still runs.
TEST(Handoff, BadHandoffsAreRefusedAtSubmit) {
  auto p = engine(options(DType::kBF16));
  auto d = engine(options(DType::kBF16));
  auto other = engine(options(DType::kF32));  // another KV format: another fingerprint
  ASSERT_TRUE(p && d && other);
  EngineRequest r = request("r", 70, 2, 8, false);
  EngineRequest first = r;
  first.hand_off = true;
  Collector pc;
  run(*p, first, &pc);
  ASSERT_TRUE(pc.handoff);
  const KvHandoff good = *pc.handoff;

  auto refused = [&](Engine& e, const KvHandoff& h, EngineRequest req, const std::string& says) {
    req.resume = std::make_shared<KvHandoff>(h);
    Status st = e.submit(req, [](const RequestOutput&) {});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << says << ": " << st.to_string();
    EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
  };
  refused(*other, good, r, "fingerprint");
  KvHandoff h = good;
  h.fingerprint ^= 1;
  refused(*d, h, r, "fingerprint");
  h = good;
  h.block_bytes += 1;
  refused(*d, h, r, "bytes");
  EngineRequest another = r;
  another.prompt[5] ^= 1;
  refused(*d, good, another, "another prompt");
  h = good;
  h.blocks.pop_back();
  refused(*d, h, r, "KV blocks");
  h = good;
  h.blocks[0].pop_back();
  refused(*d, h, r, "wrong size");
  h = good;
  h.n_computed = int64_t(h.tokens.size());
  refused(*d, h, r, "inconsistent");
  h = good;
  h.rng_state = "not a state";
  refused(*d, h, r, "sampler");
  EngineRequest done = r;
  done.max_tokens = 1;
  refused(*d, good, done, "max_tokens");
  EngineRequest twice = r;
  twice.hand_off = true;
  refused(*d, good, twice, "again");

  EngineRequest rest = r;
  rest.resume = pc.handoff;
  Collector dc;
  run(*d, rest, &dc);
  EXPECT_EQ(dc.reason, FinishReason::kLength);
  EXPECT_EQ(dc.tokens.size(), 7u);
}

// Through the engine's PdHooks (what a unit uses, every rank of an EP unit included): the
// prefill engine offers each hand-off and reports only its address; the decode engine pulls it
// on a thread of its own while it keeps stepping, then continues as from an inline hand-off. A
// failed pull, a pulled hand-off that does not fit, and a cancel while pulling each end the
// request with the reason; others are unaffected.
TEST(Handoff, OfferAndPullThroughTheHooks) {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const KvHandoff>> held;
  std::atomic<bool> release{true};
  EngineOptions po = options(DType::kBF16);
  po.pd.offer = [&](const std::string& handle,
                    std::shared_ptr<const KvHandoff> h) -> Result<std::string> {
    std::lock_guard<std::mutex> lock(mu);
    held[handle] = std::move(h);
    return std::string("unit-p:1");
  };
  EngineOptions dopt = options(DType::kBF16);
  dopt.pd.pull = [&](const std::string& address, const std::string& handle,
                     const std::atomic<bool>* stop) -> Result<std::shared_ptr<KvHandoff>> {
    while (!release.load() && !stop->load())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (address != "unit-p:1") return Unavailable("no unit at " + address);
    std::lock_guard<std::mutex> lock(mu);
    auto it = held.find(handle);
    if (it == held.end()) return NotFound("no hand-off '" + handle + "'");
    auto copy = std::make_shared<KvHandoff>(*it->second);
    if (handle == "bent") copy->fingerprint ^= 1;
    return copy;
  };
  auto colocated = engine(options(DType::kBF16));
  auto p = engine(po);
  auto d = engine(dopt);
  ASSERT_TRUE(colocated && p && d);
  for (const EngineRequest& r : {request("g", 130, 1, 10, false), request("s", 20, 2, 10, true)}) {
    Collector want;
    run(*colocated, r, &want);
    EngineRequest first = r;
    first.hand_off = true;
    Collector pc;
    run(*p, first, &pc);
    ASSERT_EQ(pc.reason, FinishReason::kHandedOff);
    EXPECT_EQ(pc.handoff, nullptr);  // it stayed with the hook
    EngineRequest rest = r;
    rest.resume_from = "unit-p:1";
    rest.resume_handle = r.id;
    Collector dc;
    run(*d, rest, &dc);
    std::vector<GeneratedToken> all = pc.generated;
    all.insert(all.end(), dc.generated.begin(), dc.generated.end());
    EXPECT_EQ(all, want.generated) << r.id;
  }
  auto ends = [&](EngineRequest r, FinishReason reason, const std::string& says) {
    Collector c;
    run(*d, r, &c);
    EXPECT_EQ(c.reason, reason) << r.id;
    EXPECT_NE(c.error.message().find(says), std::string::npos) << c.error.to_string();
  };
  EngineRequest r = request("x", 20, 3, 10, false);
  r.resume_from = "unit-p:1";
  r.resume_handle = "missing";
  ends(r, FinishReason::kError, "'missing'");
  r.resume_from = "elsewhere:2";
  ends(r, FinishReason::kError, "elsewhere:2");
  {  // a hand-off of another fingerprint, pulled: refused after the pull
    EngineRequest first = request("bent", 20, 4, 10, false);
    first.hand_off = true;
    Collector pc;
    run(*p, first, &pc);
    EngineRequest rest = request("bent", 20, 4, 10, false);
    rest.resume_from = "unit-p:1";
    rest.resume_handle = "bent";
    ends(rest, FinishReason::kError, "fingerprint");
  }
  // Cancelled while its KV is on the way; meanwhile another request runs to its end.
  release.store(false);
  EngineRequest slow = request("g", 130, 1, 10, false);
  slow.id = "slow";
  slow.resume_from = "unit-p:1";
  slow.resume_handle = "g";
  Collector sc;
  ASSERT_TRUE(d->submit(slow, sc.callback()).ok());
  Collector other;
  run(*d, request("other", 10, 5, 4, false), &other);
  EXPECT_EQ(other.tokens.size(), 4u);
  EXPECT_EQ(d->stats().loading, 1);
  d->cancel("slow");
  release.store(true);
  sc.wait();
  EXPECT_EQ(sc.reason, FinishReason::kCancelled);
  // Refused at submit: no handle; both an inline and a pulled hand-off; a pull without hooks.
  EngineRequest bad = request("b", 5, 6, 4, false);
  bad.resume_from = "unit-p:1";
  EXPECT_EQ(d->submit(bad, [](const RequestOutput&) {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(colocated->submit(slow, [](const RequestOutput&) {}).code(),
            StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace moeserve
