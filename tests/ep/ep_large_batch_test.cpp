// Batches large enough that EpDispatcher writes their expert rows with non-temporal stores and
// recycles several megabytes of row storage between calls (ep_dispatcher.cpp: kStreamRowsBytes,
// row_pool.h) give the same bits as the small batches of ep_dispatcher_test: y equals the wire
// emulation exactly, the BF16 token rows are the rounded (streamed) F32 rows, and a second step
// that reuses the first step's storage is as exact as the first.
#include <gtest/gtest.h>

#include <thread>

#include <fmt/format.h>

#include "ep/ep_dispatcher.h"
#include "ep_test_util.h"

namespace moeserve {
namespace {

using namespace ep_testing;

constexpr int kR = 2;
// Rows per rank ~ 4 x tokens per rank (K = 4 of 16 experts, half on each rank): 1500 tokens
// give ~6000 rows, 4.8 MB of F32 rows, 2.4 MB of BF16 rows; 3000 tokens double that.
constexpr int64_t kTokens = 1500;

TEST(EpLargeBatch, StreamedRowsGiveTheSameBitsTwoStepsInARow) {
  for (auto [mode, dt] : {std::pair{EpMode::kNormal, DispatchDType::kFp8},
                          std::pair{EpMode::kLowLatency, DispatchDType::kBf16},
                          std::pair{EpMode::kNormal, DispatchDType::kF32}}) {
    auto group = make_in_process_group(kR, CommOptions{std::chrono::milliseconds(20000)});
    ExpertPlacement pl = *ExpertPlacement::contiguous(E, kR);
    std::vector<std::vector<Tokens>> steps(2);
    std::vector<std::vector<Result<std::vector<float>>>> y(
        2, std::vector<Result<std::vector<float>>>(kR, Internal("not run")));
    for (size_t s = 0; s < 2; ++s) {
      for (int r = 0; r < kR; ++r) {
        steps[s].push_back(random_tokens(kTokens + 37 * r, uint32_t(300 + 10 * s + r), any_expert));
      }
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < kR; ++r) {
      threads.emplace_back([&, r] {
        auto d = EpDispatcher::create(*group[size_t(r)], pl, {dt, mode, H, K, 2 * kTokens});
        for (size_t s = 0; s < 2; ++s) {
          y[s][size_t(r)] =
              d.ok() ? moe_step(**d, steps[s][size_t(r)]) : Result<std::vector<float>>(d.status());
        }
      });
    }
    for (auto& t : threads) t.join();
    for (size_t s = 0; s < 2; ++s) {
      for (int r = 0; r < kR; ++r) {
        ASSERT_TRUE(y[s][size_t(r)].ok()) << y[s][size_t(r)].status().to_string();
        expect_matches(steps[s][size_t(r)], *y[s][size_t(r)], dt,
                       fmt::format("{} {} step {} rank {}", ep_mode_name(mode),
                                   dispatch_dtype_name(dt), s, r));
      }
    }
  }
}

TEST(EpLargeBatch, Bf16RowsAreTheRoundedStreamedF32Rows) {
  auto group = make_in_process_group(kR, CommOptions{std::chrono::milliseconds(20000)});
  ExpertPlacement pl = *ExpertPlacement::contiguous(E, kR);
  BothRowKinds got = dispatch_both_row_kinds(
      group, pl, EpOptions{DispatchDType::kFp8, EpMode::kNormal, H, K, 0},
      [](int r) { return random_tokens(2 * kTokens + 11 * r, 500 + uint32_t(r), any_expert); });
  for (int r = 0; r < kR; ++r) {
    ASSERT_TRUE(got.status[size_t(r)].ok()) << got.status[size_t(r)].to_string();
    const ExpertBatch &a = got.f32[size_t(r)], &b = got.bf16[size_t(r)];
    ASSERT_GE(a.x.size() * 4, size_t(4) << 20) << "too small to take the streaming path";
    EXPECT_EQ(a.offsets, b.offsets);
    EXPECT_EQ(a.row_weight, b.row_weight);
    ASSERT_EQ(b.row_source.size(), size_t(a.n_rows()));
    EXPECT_EQ(bf16_row_mismatches(a, b), 0) << "rank " << r;
  }
}

}  // namespace
}  // namespace moeserve
