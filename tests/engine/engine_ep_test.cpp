// The serving engine across the ranks of an in-process EP group (DP attention, EP MoE): rank 0
// takes the requests and spreads them over the ranks; every rank steps together; results equal
// the single-process engine's; cancellation reaches the serving rank; stopping rank 0 stops the
// group; a silent rank makes rank 0 fail fast and refuse new work.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "../model/test_models.h"
#include "collector.h"
#include "engine/llm_engine.h"
#include "engine/rank_messages.h"
#include "ep/communicator.h"
#include "ep/ep_dispatcher.h"
#include "model/checkpoint.h"

namespace moeserve {
namespace {

using testing::Collector;

std::string model_dir() {
  return testing::small_model_dir("engine_ep", "tiny");
}

EngineOptions options() {
  EngineOptions o;
  o.model_dir = model_dir();
  o.threads = 1;
  o.kv_cache_gb = 0.05;
  o.max_batch_tokens = 96;
  o.kv_dtype = DType::kF32;
  return o;
}

EngineRequest request(const std::string& id, int n_prompt, int salt, int64_t max_tokens = 10) {
  EngineRequest r;
  r.id = id;
  for (int i = 0; i < n_prompt; ++i) r.prompt.push_back((i * 17 + salt * 29 + 3) % 1000);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.seed = 7;
  return r;
}

// R engines over one in-process group, expert dispatch with the lossless F32 payload.
struct Group {
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<EpDispatcher>> dispatchers;
  std::vector<std::unique_ptr<Engine>> engines;

  static Group make(int R, std::chrono::milliseconds timeout = std::chrono::milliseconds(30000),
                    int start_ranks = -1) {
    Group g;
    g.comms = make_in_process_group(R, CommOptions{timeout});
    auto ck = Checkpoint::open(model_dir());
    EXPECT_TRUE(ck.ok());
    const ModelConfig& c = (*ck)->config();
    EpOptions eo;
    eo.dtype = DispatchDType::kF32;
    for (int r = 0; r < R; ++r) {
      auto placement = ExpertPlacement::contiguous(c.n_routed_experts, R);
      EXPECT_TRUE(placement.ok());
      auto d = EpDispatcher::create(*g.comms[size_t(r)], std::move(*placement), eo);
      EXPECT_TRUE(d.ok()) << d.status().to_string();
      g.dispatchers.push_back(std::move(*d));
    }
    // Engines start stepping as soon as they exist; each rank's step thread uses only its own
    // communicator, so building them one after another is fine.
    int n = start_ranks < 0 ? R : start_ranks;
    for (int r = 0; r < n; ++r) {
      EngineParallel par;
      par.comm = g.comms[size_t(r)].get();
      par.dispatcher = g.dispatchers[size_t(r)].get();
      par.idle_heartbeat = std::chrono::milliseconds(20);
      auto e = make_engine(options(), &par);
      EXPECT_TRUE(e.ok()) << e.status().to_string();
      g.engines.push_back(std::move(*e));
    }
    return g;
  }
  // Rank 0 first: its stop reaches the others, whose loops then end.
  void stop() {
    if (!engines.empty()) engines[0].reset();
    for (auto& e : engines) e.reset();
  }
  Group() = default;
  Group(Group&&) = default;
  ~Group() { stop(); }
};

TEST(RankMessages, RoundTripAndRejectTruncation) {
  FrontMessage f;
  f.stop = true;
  EngineRequest r = request("req-1", 5, 1);
  r.sampling = {0.7f, 0.9f, 40};
  r.stop_token_ids = {3, 4};
  r.top_logprobs = 2;
  f.requests.push_back(r);
  r.id = "req-2";
  r.logprobs = false;
  r.top_logprobs = 0;
  f.requests.push_back(r);
  f.cancels = {"a", "bb"};
  r.ignore_eos = true;
  r.max_tokens = 77;
  r.seed = std::nullopt;
  f.requests.push_back(r);
  r.id = "req-3";  // with logit adjustments
  r.sampling.min_p = 0.1f;
  r.sampling.presence_penalty = 0.5f;
  r.sampling.frequency_penalty = -0.25f;
  r.sampling.repetition_penalty = 1.2f;
  r.sampling.logit_bias = {{1, 2.0f}, {9, -3.5f}};
  f.requests.push_back(r);
  std::vector<uint8_t> bytes = encode(f);
  auto back = decode_front(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, f);  // every field of every request
  for (size_t cut = 0; cut < bytes.size(); cut += 3) {
    EXPECT_FALSE(decode_front(std::span<const uint8_t>(bytes.data(), cut)).ok()) << cut;
  }

  RankMessage m;
  RequestOutput o;
  o.tokens.push_back({42, -1.5f, {{42, -1.5f}, {7, -2.0f}}});
  o.finished = true;
  o.finish_reason = FinishReason::kError;
  o.error = Unavailable("gone");
  o.prompt_tokens = 9;
  o.cached_prompt_tokens = 4;
  m.outputs.emplace_back("x", o);
  o = RequestOutput{};
  o.tokens.push_back({3, -0.25f, {}});
  m.outputs.emplace_back("y", o);
  m.stats = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  bytes = encode(m);
  auto mb = decode_rank(bytes);
  ASSERT_TRUE(mb.ok()) << mb.status().to_string();
  EXPECT_EQ(*mb, m);  // every field of every output and of the statistics
  bytes.push_back(0);
  EXPECT_FALSE(decode_rank(bytes).ok());
}

TEST(EngineEp, RanksShareTheRequestsAndMatchOneProcess) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(request(fmt::format("r{}", i), 5 + 37 * i, i, 8));
  std::vector<std::vector<int32_t>> want(reqs.size());
  std::vector<std::vector<float>> want_lp(reqs.size());
  {
    auto single = make_engine(options());
    ASSERT_TRUE(single.ok()) << single.status().to_string();
    for (size_t i = 0; i < reqs.size(); ++i) {
      Collector c;
      ASSERT_TRUE((*single)->submit(reqs[i], c.callback()).ok());
      c.wait();
      want[i] = c.tokens;
      want_lp[i] = c.logprobs;
    }
  }
  for (int R : {2, 4}) {
    Group g = Group::make(R);
    std::vector<Collector> cs(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(g.engines[0]->submit(reqs[i], cs[i].callback()).ok());
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      cs[i].wait();
      EXPECT_EQ(cs[i].reason, FinishReason::kLength);
      EXPECT_EQ(cs[i].tokens, want[i]) << "R=" << R << " request " << i;
      ASSERT_EQ(cs[i].logprobs.size(), want_lp[i].size());
      for (size_t t = 0; t < want_lp[i].size(); ++t) {
        EXPECT_NEAR(cs[i].logprobs[t], want_lp[i][t], 1e-4) << "R=" << R << " request " << i;
      }
    }
    // Every rank served some of them; rank 0 reports the group's totals.
    int64_t generated = 0;
    for (int r = 1; r < R; ++r) {
      EngineStats s = g.engines[size_t(r)]->stats();
      EXPECT_GT(s.generated_tokens, 0) << "rank " << r << " got no request";
      generated += s.generated_tokens;
    }
    EXPECT_LT(generated, 6 * 8);
    // Rank 0's totals include the others' as of the last exchange, which may trail by a step.
    for (int tries = 0; tries < 100 && g.engines[0]->stats().generated_tokens < 6 * 8; ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(g.engines[0]->stats().generated_tokens, 6 * 8);
    EXPECT_FALSE(g.engines[1]->submit(reqs[0], [](const RequestOutput&) {}).ok());

    g.engines[0].reset();  // stops the group
    for (int r = 1; r < R; ++r) {
      for (int tries = 0; tries < 200 && g.engines[size_t(r)]->healthy(); ++tries) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_FALSE(g.engines[size_t(r)]->healthy()) << "rank " << r << " kept running";
      EXPECT_TRUE(g.engines[size_t(r)]->failure().ok())
          << g.engines[size_t(r)]->failure().to_string();
    }
  }
}

TEST(EngineEp, CancelReachesTheServingRankAndFreesItsBlocks) {
  Group g = Group::make(2);
  // The first request lands on rank 0 (all ranks idle, lowest rank wins), the second on rank 1.
  Collector a, b;
  ASSERT_TRUE(g.engines[0]->submit(request("a", 20, 1, 3000), a.callback()).ok());
  ASSERT_TRUE(g.engines[0]->submit(request("b", 20, 2, 3000), b.callback()).ok());
  ASSERT_TRUE(b.wait_tokens(2));
  g.engines[0]->cancel("b");
  b.wait();
  EXPECT_EQ(b.reason, FinishReason::kCancelled);
  EXPECT_LT(b.tokens.size(), 3000u);
  for (int tries = 0; tries < 200 && g.engines[1]->stats().kv_blocks_used > 0; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(g.engines[1]->stats().kv_blocks_used, 0);
  EXPECT_EQ(g.engines[1]->stats().running, 0);
  g.engines[0]->cancel("a");
  a.wait();
  EXPECT_EQ(a.reason, FinishReason::kCancelled);
}

TEST(EngineEp, AWorkerStoppedAloneLeavesAndRankZeroFailsFast) {
  // Rank 1 is stopped on its own (its process told to exit) while rank 0 keeps serving: rank 1's
  // engine must come down (not wait forever in exchanges that rank 0's heartbeats keep alive),
  // and rank 0 must fail within the timeout, naming it.
  Group g = Group::make(2, std::chrono::milliseconds(500));
  Collector a;
  ASSERT_TRUE(g.engines[0]->submit(request("a", 5, 1, 4), a.callback()).ok());
  a.wait();
  const auto t0 = std::chrono::steady_clock::now();
  g.engines[1].reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  for (int tries = 0; tries < 300 && g.engines[0]->healthy(); ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(g.engines[0]->healthy());
  EXPECT_NE(g.engines[0]->failure().message().find("rank 1"), std::string::npos)
      << g.engines[0]->failure().to_string();
}

TEST(EngineEp, SilentRankFailsRankZeroFast) {
  // Rank 1's engine never starts: rank 0's first exchange times out and names it.
  Group g = Group::make(2, std::chrono::milliseconds(300), /*start_ranks=*/1);
  for (int tries = 0; tries < 300 && g.engines[0]->healthy(); ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(g.engines[0]->healthy());
  Status f = g.engines[0]->failure();
  EXPECT_EQ(f.code(), StatusCode::kUnavailable) << f.to_string();
  EXPECT_NE(f.message().find("rank 1"), std::string::npos) << f.message();
  Status s = g.engines[0]->submit(request("late", 3, 1), [](const RequestOutput&) {});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace moeserve
