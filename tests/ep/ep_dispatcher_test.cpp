// EpDispatcher over the in-process group (ranks as threads) against LocalDispatcher and against
// an independent emulation of the wire numerics (BF16 or FP8 1x128 payload, BF16 combine rows,
// gate-weighted sum in top-k slot order), which it must match bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "ep/ep_dispatcher.h"
#include "ep_test_util.h"

namespace moeserve {
namespace {

using namespace ep_testing;

struct EpSetup {
  int R = 1;
  EpOptions options;
  std::optional<ExpertPlacement> placement;  // default: contiguous
};

// Runs `steps` MoE steps on every rank (per_rank[step][rank]) through an in-process group.
std::vector<std::vector<Result<std::vector<float>>>> run_ep(
    const EpSetup& s, const std::vector<std::vector<Tokens>>& steps) {
  auto group = make_in_process_group(s.R, CommOptions{std::chrono::milliseconds(20000)});
  ExpertPlacement pl = s.placement ? *s.placement : *ExpertPlacement::contiguous(E, s.R);
  std::vector<std::vector<Result<std::vector<float>>>> y(
      steps.size(), std::vector<Result<std::vector<float>>>(size_t(s.R), Internal("not run")));
  std::vector<std::thread> threads;
  for (int r = 0; r < s.R; ++r) {
    threads.emplace_back([&, r] {
      auto d = EpDispatcher::create(*group[size_t(r)], pl, s.options);
      for (size_t st = 0; st < steps.size(); ++st) {
        y[st][size_t(r)] =
            d.ok() ? moe_step(**d, steps[st][size_t(r)]) : Result<std::vector<float>>(d.status());
      }
    });
  }
  for (auto& t : threads) t.join();
  return y;
}

struct Case {
  int R;
  EpMode mode;
  DispatchDType dtype;
};

class EpDispatcherRandom : public ::testing::TestWithParam<Case> {};

TEST_P(EpDispatcherRandom, MatchesLocalDispatcherOnRandomRouting) {
  const Case c = GetParam();
  // Token counts per rank; every group with R > 1 has a rank with no tokens.
  const std::vector<int64_t> counts = c.R == 1   ? std::vector<int64_t>{13}
                                      : c.R == 2 ? std::vector<int64_t>{0, 19}
                                                 : std::vector<int64_t>{5, 0, 17, 3};
  EpSetup s;
  s.R = c.R;
  s.options = {c.dtype, c.mode, H, K, 20};
  std::vector<std::vector<Tokens>> steps(2);
  for (size_t st = 0; st < 2; ++st) {
    for (int r = 0; r < c.R; ++r) {
      // The second step swaps which ranks are busy (buffers reused with other sizes).
      int64_t n = counts[size_t(st == 0 ? r : c.R - 1 - r)];
      steps[st].push_back(random_tokens(n, uint32_t(100 * st + r), any_expert));
    }
  }
  auto y = run_ep(s, steps);
  for (size_t st = 0; st < 2; ++st) {
    for (int r = 0; r < c.R; ++r) {
      ASSERT_TRUE(y[st][size_t(r)].ok()) << y[st][size_t(r)].status().to_string();
      expect_matches(steps[st][size_t(r)], *y[st][size_t(r)], c.dtype,
                     fmt::format("step {} rank {}", st, r));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, EpDispatcherRandom,
                         ::testing::Values(Case{1, EpMode::kNormal, DispatchDType::kBf16},
                                           Case{1, EpMode::kLowLatency, DispatchDType::kFp8},
                                           Case{2, EpMode::kNormal, DispatchDType::kBf16},
                                           Case{2, EpMode::kNormal, DispatchDType::kFp8},
                                           Case{2, EpMode::kLowLatency, DispatchDType::kBf16},
                                           Case{2, EpMode::kLowLatency, DispatchDType::kFp8},
                                           Case{2, EpMode::kNormal, DispatchDType::kF32},
                                           Case{4, EpMode::kLowLatency, DispatchDType::kF32},
                                           Case{4, EpMode::kNormal, DispatchDType::kBf16},
                                           Case{4, EpMode::kNormal, DispatchDType::kFp8},
                                           Case{4, EpMode::kLowLatency, DispatchDType::kBf16},
                                           Case{4, EpMode::kLowLatency, DispatchDType::kFp8}),
                         [](const auto& info) {
                           return fmt::format(
                               "R{}_{}_{}", info.param.R,
                               info.param.mode == EpMode::kNormal ? "normal" : "lowlatency",
                               dispatch_dtype_name(info.param.dtype));
                         });

TEST(EpDispatcher, EveryExpertOnADifferentRankThanItsTokens) {
  for (int R : {2, 4}) {
    // Round-robin placement (not contiguous: the placement is a table), and each rank's tokens
    // pick only experts held elsewhere.
    std::vector<int32_t> table;
    for (int32_t e = 0; e < E; ++e) table.push_back(e % R);
    for (auto [mode, dt] : {std::pair{EpMode::kNormal, DispatchDType::kBf16},
                            std::pair{EpMode::kLowLatency, DispatchDType::kFp8}}) {
      EpSetup s;
      s.R = R;
      s.options = {dt, mode, H, K, 16};
      s.placement = *ExpertPlacement::from_table(table, R);
      std::vector<std::vector<Tokens>> steps(1);
      for (int r = 0; r < R; ++r) {
        steps[0].push_back(
            random_tokens(11 + r, uint32_t(7 + r), [&](int32_t e) { return e % R != r; }));
      }
      auto y = run_ep(s, steps);
      for (int r = 0; r < R; ++r) {
        ASSERT_TRUE(y[0][size_t(r)].ok()) << y[0][size_t(r)].status().to_string();
        expect_matches(steps[0][size_t(r)], *y[0][size_t(r)], dt,
                       fmt::format("R {} rank {}", R, r));
      }
    }
  }
}

TEST(EpDispatcher, SameBitsWhateverTheNumberOfRanks) {
  // The same 24 tokens: all on one rank of R = 1, or split over the 4 ranks of R = 4.
  Tokens all = random_tokens(24, 42, any_expert);
  auto slice = [&](int64_t a, int64_t b) {
    Tokens t;
    t.n = b - a;
    t.x.assign(all.x.begin() + a * H, all.x.begin() + b * H);
    t.ids.assign(all.ids.begin() + a * K, all.ids.begin() + b * K);
    t.w.assign(all.w.begin() + a * K, all.w.begin() + b * K);
    return t;
  };
  EpSetup one, four;
  one.options = four.options = {DispatchDType::kFp8, EpMode::kNormal, H, K, 24};
  four.R = 4;
  auto y1 = run_ep(one, {{all}});
  auto y4 = run_ep(four, {{slice(0, 10), slice(10, 10), slice(10, 21), slice(21, 24)}});
  ASSERT_TRUE(y1[0][0].ok());
  std::vector<float> joined;
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(y4[0][size_t(r)].ok()) << y4[0][size_t(r)].status().to_string();
    joined.insert(joined.end(), y4[0][size_t(r)]->begin(), y4[0][size_t(r)]->end());
  }
  EXPECT_EQ(joined, *y1[0][0]);
}

// EpOptions::bf16_rows: the rows arrive as the BF16 rounding of the F32 rows, in the same
// layout, each token stored once, for the FP8 and BF16 payloads (both modes); the lossless F32
// payload ignores it.
TEST(EpDispatcher, Bf16RowsAreTheRoundedF32Rows) {
  for (DispatchDType dt : {DispatchDType::kFp8, DispatchDType::kBf16, DispatchDType::kF32}) {
    for (EpMode mode : {EpMode::kNormal, EpMode::kLowLatency}) {
      const int R = 2;
      auto group = make_in_process_group(R, CommOptions{std::chrono::milliseconds(20000)});
      ExpertPlacement pl = *ExpertPlacement::contiguous(E, R);
      BothRowKinds got = dispatch_both_row_kinds(
          group, pl, EpOptions{dt, mode, H, K, 64},
          [](int r) { return random_tokens(20 + 7 * r, 90 + uint32_t(r), any_expert); });
      const std::string what = std::string(dispatch_dtype_name(dt)) + " " + ep_mode_name(mode);
      for (int r = 0; r < R; ++r) {
        const Status& st = got.status[size_t(r)];
        ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
        const ExpertBatch &a = got.f32[size_t(r)], &b = got.bf16[size_t(r)];
        EXPECT_EQ(a.offsets, b.offsets) << what;
        EXPECT_EQ(a.experts, b.experts) << what;
        EXPECT_EQ(a.row_weight, b.row_weight) << what;
        ASSERT_EQ(a.x.size(), size_t(a.n_rows() * H)) << what;
        if (dt == DispatchDType::kF32) {
          EXPECT_EQ(b.x, a.x) << what;
          EXPECT_FALSE(b.has_bf16_rows()) << what;
          continue;
        }
        EXPECT_TRUE(b.x.empty()) << what;
        ASSERT_TRUE(b.has_bf16_rows()) << what;
        ASSERT_EQ(b.row_source.size(), size_t(a.n_rows())) << what;
        EXPECT_EQ(bf16_row_mismatches(a, b), 0) << what;
        // Each received token once: no more token rows than rows, and (FP8 and BF16 payloads
        // carry a token once per rank) fewer when tokens have several experts on this rank.
        EXPECT_LT(b.tokens_bf16.size(), size_t(a.n_rows() * H)) << what;
      }
    }
  }
}

// Expert outputs handed to combine as BF16 (the fast path's expert GEMMs write them so) give
// the same y, bit for bit, as the same values in F32, for every payload and both modes, with
// rows crossing ranks and rows staying on theirs; and the same for LocalDispatcher.
TEST(EpDispatcher, Bf16ExpertOutputsCombineLikeTheirF32Values) {
  // Expert outputs with a BF16 representation: run_experts' rows rounded to BF16.
  auto outputs = [](const ExpertBatch& b) {
    std::vector<float> out = run_experts(b);
    std::vector<uint16_t> out16(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      out16[i] = f32_to_bf16(out[i]);
      out[i] = bf16_to_f32(out16[i]);
    }
    return std::make_pair(out, out16);
  };
  for (DispatchDType dt : {DispatchDType::kFp8, DispatchDType::kBf16, DispatchDType::kF32}) {
    for (EpMode mode : {EpMode::kNormal, EpMode::kLowLatency}) {
      const int R = 4;
      const std::string what = std::string(dispatch_dtype_name(dt)) + " " + ep_mode_name(mode);
      auto group = make_in_process_group(R, CommOptions{std::chrono::milliseconds(20000)});
      ExpertPlacement pl = *ExpertPlacement::contiguous(E, R);
      std::vector<std::vector<float>> y32(R), y16(R);
      std::vector<Status> status(R);
      std::vector<std::thread> threads;
      for (int r = 0; r < R; ++r) {
        threads.emplace_back([&, r] {
          Tokens t = random_tokens(9 + 5 * r, 300 + uint32_t(r), any_expert);
          auto d = EpDispatcher::create(*group[size_t(r)], pl, EpOptions{dt, mode, H, K, 32});
          if (!d.ok()) {
            status[size_t(r)] = d.status();
            return;
          }
          auto b = (*d)->dispatch(t.x.data(), t.n, H, t.ids.data(), t.w.data(), K);
          if (!b.ok()) {
            status[size_t(r)] = b.status();
            return;
          }
          auto [out, out16] = outputs(*b);
          y32[size_t(r)].assign(size_t(t.n * H), -1.0f);
          y16[size_t(r)].assign(size_t(t.n * H), -2.0f);
          status[size_t(r)] = (*d)->combine(*b, out.data(), y32[size_t(r)].data());
          Status s16 = (*d)->combine(*b, out16.data(), y16[size_t(r)].data());
          if (status[size_t(r)].ok()) status[size_t(r)] = s16;
        });
      }
      for (auto& th : threads) th.join();
      for (int r = 0; r < R; ++r) {
        ASSERT_TRUE(status[size_t(r)].ok()) << what << ": " << status[size_t(r)].to_string();
        ASSERT_EQ(y16[size_t(r)].size(), y32[size_t(r)].size()) << what;
        EXPECT_EQ(
            std::memcmp(y16[size_t(r)].data(), y32[size_t(r)].data(), y32[size_t(r)].size() * 4), 0)
            << what << " rank " << r;
      }
    }
  }
  LocalDispatcher local(E);
  Tokens t = random_tokens(17, 7, any_expert);
  auto b = local.dispatch(t.x.data(), t.n, H, t.ids.data(), t.w.data(), K);
  ASSERT_TRUE(b.ok());
  auto [out, out16] = outputs(*b);
  std::vector<float> y32(size_t(t.n * H)), y16(size_t(t.n * H));
  ASSERT_TRUE(local.combine(*b, out.data(), y32.data()).ok());
  ASSERT_TRUE(local.combine(*b, out16.data(), y16.data()).ok());
  EXPECT_EQ(std::memcmp(y16.data(), y32.data(), y32.size() * 4), 0) << "LocalDispatcher";
}

// Wraps a communicator and records the bytes each all_to_all_v sends to each peer.
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* transport() const override { return "counting"; }
  Status all_to_all_v(const void* send, PeerChunks sc, void* recv, PeerChunks rc,
                      std::span<size_t> received) override {
    calls.emplace_back(sc.counts.begin(), sc.counts.end());
    return inner_.all_to_all_v(send, sc, recv, rc, received);
  }
  Status send(int p, int tag, std::span<const uint8_t> b) override {
    return inner_.send(p, tag, b);
  }
  Result<size_t> recv(int p, int tag, std::span<uint8_t> b) override {
    return inner_.recv(p, tag, b);
  }
  std::vector<std::vector<size_t>> calls;

 private:
  Communicator& inner_;
};

TEST(EpDispatcher, SendsEachTokenOnceToEachRankHoldingItsExperts) {
  const int R = 4;
  auto group = make_in_process_group(R);
  auto pl = *ExpertPlacement::contiguous(E, R);
  std::vector<Tokens> tokens;
  for (int r = 0; r < R; ++r) tokens.push_back(random_tokens(9 + r, uint32_t(50 + r), any_expert));
  std::vector<std::unique_ptr<CountingCommunicator>> counting;
  for (int r = 0; r < R; ++r)
    counting.push_back(std::make_unique<CountingCommunicator>(*group[size_t(r)]));
  std::vector<Status> st(static_cast<size_t>(R));
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) {
    threads.emplace_back([&, r] {
      auto d =
          EpDispatcher::create(*counting[size_t(r)], pl, {DispatchDType::kFp8, EpMode::kNormal});
      st[size_t(r)] = d.ok() ? moe_step(**d, tokens[size_t(r)]).status() : d.status();
    });
  }
  for (auto& t : threads) t.join();
  const size_t record = DispatchRecordLayout::make(H, K, DispatchDType::kFp8).bytes;
  for (int r = 0; r < R; ++r) {
    ASSERT_TRUE(st[size_t(r)].ok()) << st[size_t(r)].to_string();
    const Tokens& t = tokens[size_t(r)];
    std::vector<size_t> tokens_to(size_t(R), 0), entries_to(size_t(R), 0);
    for (int64_t i = 0; i < t.n; ++i) {
      std::vector<bool> hit(size_t(R), false);
      for (int64_t j = 0; j < K; ++j) {
        int dst = pl.rank_of(t.ids[size_t(i * K + j)]);
        ++entries_to[size_t(dst)];
        hit[size_t(dst)] = true;
      }
      for (int p = 0; p < R; ++p) tokens_to[size_t(p)] += hit[size_t(p)];
    }
    // Normal mode: counts (8 bytes per peer), records, then the combine rows of the other ranks.
    const auto& calls = counting[size_t(r)]->calls;
    ASSERT_EQ(calls.size(), 3u);
    for (int p = 0; p < R; ++p) {
      EXPECT_EQ(calls[0][size_t(p)], 8u);
      EXPECT_EQ(calls[1][size_t(p)], tokens_to[size_t(p)] * record) << "rank " << r << " to " << p;
    }
    size_t entries = 0;
    for (size_t e : entries_to) entries += e;
    EXPECT_LT(tokens_to[0] + tokens_to[1] + tokens_to[2] + tokens_to[3], entries)
        << "routing this random should put some token's experts on one rank twice";
  }
}

TEST(EpDispatcher, LowLatencyUsesTheMaskedLayout) {
  auto group = make_in_process_group(1);
  auto d = EpDispatcher::create(*group[0], *ExpertPlacement::contiguous(E, 1),
                                {DispatchDType::kBf16, EpMode::kLowLatency, H, K, 8});
  ASSERT_TRUE(d.ok());
  Tokens t = random_tokens(6, 3, any_expert);
  auto b = (*d)->dispatch(t.x.data(), t.n, H, t.ids.data(), t.w.data(), K);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->layout, ExpertLayout::kMasked);
  ASSERT_EQ(b->experts.size(), size_t(E));  // every local expert has a slab
  int64_t capacity = b->offsets[1], used = 0;
  for (size_t s = 0; s < b->experts.size(); ++s) {
    EXPECT_EQ(b->segment_begin(s), int64_t(s) * capacity);
    EXPECT_LE(b->segment_rows(s), capacity);
    used += b->segment_rows(s);
    for (int64_t r = b->segment_begin(s) + b->segment_rows(s); r < b->segment_begin(s + 1); ++r) {
      EXPECT_EQ(b->x[size_t(r * H)], 0.0f) << "padding rows are zero";
    }
  }
  EXPECT_EQ(used, t.n * K);
}

TEST(EpDispatcher, TwoBatchesInFlightGiveTheSameResult) {
  // Micro-batches: dispatch A, dispatch B, combine A, combine B.
  for (EpMode mode : {EpMode::kNormal, EpMode::kLowLatency}) {
    auto group = make_in_process_group(1);
    auto d = EpDispatcher::create(*group[0], *ExpertPlacement::contiguous(E, 1),
                                  {DispatchDType::kFp8, mode, H, K, 8});
    ASSERT_TRUE(d.ok());
    Tokens a = random_tokens(5, 1, any_expert), b = random_tokens(8, 2, any_expert);
    auto ba = (*d)->dispatch(a.x.data(), a.n, H, a.ids.data(), a.w.data(), K);
    auto bb = (*d)->dispatch(b.x.data(), b.n, H, b.ids.data(), b.w.data(), K);
    ASSERT_TRUE(ba.ok() && bb.ok());
    std::vector<float> oa = run_experts(*ba), ob = run_experts(*bb);
    std::vector<float> ya(size_t(a.n * H)), yb(size_t(b.n * H));
    ASSERT_TRUE((*d)->combine(*ba, oa.data(), ya.data()).ok());
    ASSERT_TRUE((*d)->combine(*bb, ob.data(), yb.data()).ok());
    EXPECT_EQ(ya, emulate(a, DispatchDType::kFp8));
    EXPECT_EQ(yb, emulate(b, DispatchDType::kFp8));
  }
}

TEST(EpDispatcher, RejectsBadInput) {
  auto group = make_in_process_group(1);
  auto pl = *ExpertPlacement::contiguous(E, 1);
  auto ll =
      EpDispatcher::create(*group[0], pl, {DispatchDType::kFp8, EpMode::kLowLatency, H, K, 4});
  ASSERT_TRUE(ll.ok());
  Tokens t = random_tokens(5, 9, any_expert);
  auto over = (*ll)->dispatch(t.x.data(), t.n, H, t.ids.data(), t.w.data(), K);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("capacity of 4"), std::string::npos);

  auto normal = EpDispatcher::create(*group[0], pl, {});
  ASSERT_TRUE(normal.ok());
  t.ids[3] = int32_t(E);
  auto bad = (*normal)->dispatch(t.x.data(), t.n, H, t.ids.data(), t.w.data(), K);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  ExpertBatch foreign;
  EXPECT_EQ((*normal)->combine(foreign, static_cast<const float*>(nullptr), nullptr).code(),
            StatusCode::kInternal);

  EXPECT_FALSE(EpDispatcher::create(*group[0], *ExpertPlacement::contiguous(E, 2), {}).ok());
  EXPECT_FALSE(
      EpDispatcher::create(*group[0], pl, {DispatchDType::kFp8, EpMode::kLowLatency}).ok());
}

TEST(ExpertPlacement, ContiguousAndTable) {
  auto p = ExpertPlacement::contiguous(16, 4);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rank_of(0), 0);
  EXPECT_EQ(p->rank_of(5), 1);
  EXPECT_EQ(p->rank_of(15), 3);
  EXPECT_EQ(p->local_index(0, 1, 6), 2);
  EXPECT_EQ(p->experts_on(0, 2), (std::vector<int32_t>{8, 9, 10, 11}));
  EXPECT_EQ(p->experts_on(7, 2), p->experts_on(0, 2)) << "one table serves every layer";
  EXPECT_FALSE(p->per_layer());
  EXPECT_TRUE(p->holds(3, 2, 9));
  EXPECT_FALSE(p->holds(3, 2, 12));
  EXPECT_EQ(p->route(0, 9, 0, 5), 2);
  EXPECT_EQ(ExpertPlacement::contiguous(16, 3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ExpertPlacement::from_table({0, 2}, 2).ok());
  auto t = ExpertPlacement::from_table({1, 0, 1}, 2);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->experts_on(0, 1), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(t->local_index(0, 1, 2), 1);
}

TEST(WireFormat, DeepSeekV3RecordBytes) {
  // hidden 7168, top-8: 4 (count) + 32 (ids) + 32 (weights) + 56 * 4 (scales) + 7168 (FP8).
  auto fp8 = DispatchRecordLayout::make(7168, 8, DispatchDType::kFp8);
  EXPECT_EQ(fp8.n_scales, 56);
  EXPECT_EQ(fp8.payload_offset, 4u + 32 + 32 + 224);
  EXPECT_EQ(fp8.bytes, 7460u);
  auto bf16 = DispatchRecordLayout::make(7168, 8, DispatchDType::kBf16);
  EXPECT_EQ(bf16.bytes, 4u + 32 + 32 + 14336);
  EXPECT_EQ(combine_row_bytes(7168, DispatchDType::kFp8), 14336u);
  EXPECT_EQ(combine_row_bytes(7168, DispatchDType::kF32), 28672u);
  EXPECT_EQ(DispatchRecordLayout::make(7168, 8, DispatchDType::kF32).bytes, 4u + 64 + 28672);
  EXPECT_EQ(DispatchRecordLayout::make(201, 3, DispatchDType::kFp8).bytes % 4, 0u);
}

}  // namespace
}  // namespace moeserve
