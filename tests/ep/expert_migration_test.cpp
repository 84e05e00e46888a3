// ExpertMigration on in-process groups with a fake ExpertHost (a map of byte strings):
//   - plan_migration sends exactly what the next placement adds on each rank, from a holder;
//   - the bytes arrive intact, spread over ceil(largest sender stream / budget) steps, and the
//     group agrees only on the last step;
//   - one rank refusing an install makes every rank fail the migration and drop what it got;
//   - ExpertBalancer with a host keeps the old placement while weights move (dispatch results
//     stay exact every step) and switches when the migration ends.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "ep/ep_dispatcher.h"
#include "ep/expert_balancer.h"
#include "ep/expert_migration.h"
#include "ep_test_util.h"

namespace moeserve {
namespace {

// The bytes of expert e of layer l: a pattern of a size that differs per expert.
std::vector<uint8_t> expert_bytes(int64_t l, int32_t e) {
  std::vector<uint8_t> b(size_t(700 + 37 * e + 11 * l));
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = uint8_t((i * 7 + size_t(e) * 13 + size_t(l) * 5) & 0xff);
  return b;
}

class FakeHost final : public ExpertHost {
 public:
  // Holds the experts `p` gives `rank` in layers [0, layers).
  FakeHost(const ExpertPlacement& p, int rank, int64_t layers) {
    for (int64_t l = 0; l < layers; ++l) {
      for (int32_t e = 0; e < p.n_experts(); ++e) {
        if (p.holds(l, rank, e)) held[{l, e}] = expert_bytes(l, e);
      }
    }
  }
  Result<ExpertBlob> export_expert(int64_t l, int32_t e) override {
    if (refuse_export) return IOError("cannot read the expert");
    auto it = held.find({l, e});
    if (it == held.end()) return NotFound("not held");
    auto copy = std::make_shared<std::vector<uint8_t>>(it->second);
    ExpertBlob b;
    // Two parts, to exercise copies across part boundaries.
    b.parts.emplace_back(copy->data(), 100);
    b.parts.emplace_back(copy->data() + 100, copy->size() - 100);
    b.keep = copy;
    return b;
  }
  Status install_expert(int64_t l, int32_t e, std::vector<uint8_t> bytes) override {
    if (refuse) return Corrupt("refused");
    ++installs;
    held[{l, e}] = std::move(bytes);
    return Status::Ok();
  }
  void drop_expert(int64_t l, int32_t e) override { held.erase({l, e}); }

  std::map<std::pair<int64_t, int32_t>, std::vector<uint8_t>> held;
  int installs = 0;
  bool refuse = false;
  bool refuse_export = false;
};

// Experts 0..3 hot: the EPLB plan differs from the contiguous placement.
eplb::ExpertLoads skewed_loads(int32_t layers) {
  eplb::ExpertLoads loads(layers, int32_t(ep_testing::E));
  for (int32_t l = 0; l < layers; ++l) {
    for (int32_t e = 0; e < loads.num_experts; ++e) {
      loads.at(l, e) = e < 4 ? 100.0 + 10 * l + e : 5.0 + double((e * 7 + l) % 5);
    }
  }
  return loads;
}

TEST(ExpertMigration, PlanSendsWhatTheNextPlacementAddsFromAHolder) {
  const int R = 4;
  const int64_t L = 2;
  auto cur = *ExpertPlacement::contiguous(ep_testing::E, R);
  BalancerOptions bo{.redundant_experts = 8, .groups = 4};
  auto next = *plan_placement(skewed_loads(int32_t(L)), R, bo);
  MigrationPlan p = plan_migration(cur, next, L);
  ASSERT_FALSE(p.transfers.empty());
  for (int64_t l = 0; l < L; ++l) {
    for (int r = 0; r < R; ++r) {
      for (int32_t e = 0; e < ep_testing::E; ++e) {
        int n_in = 0;
        for (const ExpertTransfer& t : p.transfers) {
          if (t.moe_layer == l && t.expert == e && t.dst == r) {
            ++n_in;
            EXPECT_TRUE(cur.holds(l, t.src, e)) << "the sender holds it now";
          }
        }
        EXPECT_EQ(n_in, next.holds(l, r, e) && !cur.holds(l, r, e) ? 1 : 0)
            << "layer " << l << " rank " << r << " expert " << e;
        bool dropped = false;
        for (const ExpertKey& k : p.drops[size_t(r)]) dropped |= k.moe_layer == l && k.expert == e;
        EXPECT_EQ(dropped, cur.holds(l, r, e) && !next.holds(l, r, e));
      }
    }
  }
  EXPECT_TRUE(plan_migration(next, next, L).transfers.empty());
}

struct RankRun {
  std::string error;
  std::vector<ExpertMigration::Progress> progress;
  MigrationReport report;
  std::unique_ptr<FakeHost> host;
};

std::vector<RankRun> migrate(int R, int64_t budget, int refusing_rank, int refusing_exporter = -1) {
  const int64_t L = 2;
  auto cur = *ExpertPlacement::contiguous(ep_testing::E, R);
  BalancerOptions bo{.redundant_experts = 8, .groups = 4};
  auto next = *plan_placement(skewed_loads(int32_t(L)), R, bo);
  auto group = make_in_process_group(R, CommOptions{std::chrono::milliseconds(20000)});
  std::vector<RankRun> runs(static_cast<size_t>(R));
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) {
    threads.emplace_back([&, r] {
      RankRun& run = runs[size_t(r)];
      run.host = std::make_unique<FakeHost>(cur, r, L);
      run.host->refuse = r == refusing_rank;
      run.host->refuse_export = r == refusing_exporter;
      auto m = ExpertMigration::start(*group[size_t(r)], *run.host, plan_migration(cur, next, L),
                                      budget);
      if (!m.ok()) {
        run.error = m.status().to_string();
        return;
      }
      if ((*m)->export_failed()) {
        run.error = "export failed: " + (*m)->export_error().message();
        return;
      }
      for (int64_t s = 0; s < (*m)->steps(); ++s) {
        auto p = (*m)->advance();
        if (!p.ok()) {
          run.error = p.status().to_string();
          return;
        }
        run.progress.push_back(*p);
      }
      if (!run.progress.empty() && run.progress.back() == ExpertMigration::Progress::kDone) {
        (*m)->finish();
      }
      run.report = (*m)->report();
    });
  }
  for (auto& t : threads) t.join();
  return runs;
}

TEST(ExpertMigration, BytesArriveIntactOverBoundedSteps) {
  for (int R : {2, 4}) {
    const int64_t budget = 500;  // below one expert: each spans several steps
    auto runs = migrate(R, budget, -1);
    auto cur = *ExpertPlacement::contiguous(ep_testing::E, R);
    BalancerOptions bo{.redundant_experts = 8, .groups = 4};
    auto next = *plan_placement(skewed_loads(2), R, bo);
    MigrationPlan plan = plan_migration(cur, next, 2);
    std::vector<int64_t> stream(static_cast<size_t>(R), 0);
    int64_t group_bytes = 0;
    for (const ExpertTransfer& t : plan.transfers) {
      stream[size_t(t.src)] += int64_t(expert_bytes(t.moe_layer, t.expert).size());
      group_bytes += int64_t(expert_bytes(t.moe_layer, t.expert).size());
    }
    int64_t steps = 0;
    for (int64_t s : stream) steps = std::max(steps, (s + budget - 1) / budget);
    ASSERT_GT(steps, 2);
    int64_t sent = 0, received = 0;
    for (int r = 0; r < R; ++r) {
      const RankRun& run = runs[size_t(r)];
      ASSERT_EQ(run.error, "") << "R " << R << " rank " << r;
      ASSERT_EQ(int64_t(run.progress.size()), steps) << "R " << R;
      for (size_t s = 0; s + 1 < run.progress.size(); ++s) {
        EXPECT_EQ(run.progress[s], ExpertMigration::Progress::kInFlight);
      }
      EXPECT_EQ(run.progress.back(), ExpertMigration::Progress::kDone);
      EXPECT_TRUE(run.report.ok);
      EXPECT_EQ(run.report.group_bytes, group_bytes);
      EXPECT_EQ(run.report.bytes_sent, stream[size_t(r)]);
      sent += run.report.bytes_sent;
      received += run.report.bytes_received;
      // Exactly the next placement's experts, with the right bytes.
      std::map<std::pair<int64_t, int32_t>, std::vector<uint8_t>> want;
      for (int64_t l = 0; l < 2; ++l) {
        for (int32_t e = 0; e < ep_testing::E; ++e) {
          if (next.holds(l, r, e)) want[{l, e}] = expert_bytes(l, e);
        }
      }
      EXPECT_EQ(run.host->held, want) << "R " << R << " rank " << r;
      int64_t n_in = 0;
      for (const ExpertTransfer& t : plan.transfers) n_in += t.dst == r;
      EXPECT_EQ(run.host->installs, n_in);
      EXPECT_EQ(run.report.experts_received, n_in);
      EXPECT_EQ(run.report.experts_dropped, int64_t(plan.drops[size_t(r)].size()));
    }
    EXPECT_EQ(sent, group_bytes);
    EXPECT_EQ(received, group_bytes);
  }
}

TEST(ExpertMigration, OneRankFailingAnInstallCancelsOnEveryRank) {
  const int R = 4;
  auto runs = migrate(R, 4000, /*refusing_rank=*/1);
  auto cur = *ExpertPlacement::contiguous(ep_testing::E, R);
  for (int r = 0; r < R; ++r) {
    const RankRun& run = runs[size_t(r)];
    ASSERT_EQ(run.error, "");
    ASSERT_FALSE(run.progress.empty());
    EXPECT_EQ(run.progress.back(), ExpertMigration::Progress::kFailed) << "rank " << r;
    EXPECT_FALSE(run.report.ok);
    // Back to what the current placement gives it: received experts dropped, none lost.
    std::map<std::pair<int64_t, int32_t>, std::vector<uint8_t>> want;
    for (int64_t l = 0; l < 2; ++l) {
      for (int32_t e = 0; e < ep_testing::E; ++e) {
        if (cur.holds(l, r, e)) want[{l, e}] = expert_bytes(l, e);
      }
    }
    EXPECT_EQ(run.host->held, want) << "rank " << r;
  }
}

TEST(ExpertMigration, OneRankFailingAnExportCancelsOnEveryRankBeforeAnythingMoves) {
  const int R = 4;
  auto runs = migrate(R, 4000, /*refusing_rank=*/-1, /*refusing_exporter=*/2);
  auto cur = *ExpertPlacement::contiguous(ep_testing::E, R);
  for (int r = 0; r < R; ++r) {
    const RankRun& run = runs[size_t(r)];
    EXPECT_NE(run.error.find("export failed"), std::string::npos)
        << "rank " << r << ": " << run.error;
    EXPECT_NE(run.error.find(r == 2 ? "cannot read the expert" : "rank 2"), std::string::npos)
        << run.error;
    EXPECT_EQ(run.host->installs, 0);
    std::map<std::pair<int64_t, int32_t>, std::vector<uint8_t>> want;
    for (int64_t l = 0; l < 2; ++l) {
      for (int32_t e = 0; e < ep_testing::E; ++e) {
        if (cur.holds(l, r, e)) want[{l, e}] = expert_bytes(l, e);
      }
    }
    EXPECT_EQ(run.host->held, want) << "rank " << r;
  }
}

TEST(ExpertMigration, BalancerKeepsServingWhileWeightsMoveThenSwitches) {
  using namespace ep_testing;
  const int R = 4;
  const int64_t L = 2;
  auto group = make_in_process_group(R, CommOptions{std::chrono::milliseconds(20000)});
  std::vector<std::string> errors(static_cast<size_t>(R));
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(R));  // n_slots after each step
  std::vector<std::vector<MigrationReport>> reports(static_cast<size_t>(R));
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const std::string& what) { errors[size_t(r)] += what + "; "; };
      auto cur = *ExpertPlacement::contiguous(E, R);
      auto d = EpDispatcher::create(*group[size_t(r)], cur, {DispatchDType::kF32, EpMode::kNormal});
      if (!d.ok()) return fail(d.status().to_string());
      BalancerOptions bo{.redundant_experts = 8,
                         .groups = 4,
                         .window_steps = 4,
                         .interval_steps = 3,
                         .migrate_bytes_per_step = 2500};
      auto b = ExpertBalancer::create(*group[size_t(r)], **d, int32_t(L), bo);
      if (!b.ok()) return fail(b.status().to_string());
      auto host = std::make_unique<FakeHost>(cur, r, L);
      FakeHost* h = host.get();
      (*b)->set_expert_host(std::move(host));
      for (int step = 0; step < 16; ++step) {
        for (int64_t l = 0; l < L; ++l) {
          // Skewed traffic: most tokens to experts 0..3.
          Tokens t = random_tokens(6, uint32_t(100 * step + 10 * l + r),
                                   [&](int32_t e) { return e < 4 || e % 5 == 0; });
          auto batch = (*d)->dispatch(l, t.x.data(), t.n, H, t.ids.data(), t.w.data(), K);
          if (!batch.ok()) return fail(batch.status().to_string());
          // Every expert routed here must be one this rank holds (the host's weights).
          for (int32_t e : batch->experts) {
            if (!h->held.count({l, e})) fail("expert routed before its weights arrived");
          }
          std::vector<float> o = run_experts(*batch), y(size_t(t.n * H));
          if (Status st = (*d)->combine(*batch, o.data(), y.data()); !st.ok()) {
            return fail(st.to_string());
          }
          if (y != emulate(t, DispatchDType::kF32))
            fail("step " + std::to_string(step) + " differs");
        }
        auto changed = (*b)->end_step();
        if (!changed.ok()) return fail(changed.status().to_string());
        slots[size_t(r)].push_back((*d)->placement().n_slots());
      }
      reports[size_t(r)] = (*b)->migrations();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < R; ++r) {
    ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
    ASSERT_FALSE(reports[size_t(r)].empty());
    const MigrationReport& m = reports[size_t(r)][0];
    EXPECT_TRUE(m.ok);
    EXPECT_EQ(m.planned_at_step, 3);
    EXPECT_GT(m.steps, 1) << "spread over several steps";
    EXPECT_EQ(m.switched_at_step, 3 + m.steps);
    // The contiguous placement (16 slots) until the switch, the plan's 24 slots after it.
    for (int64_t s = 0; s < int64_t(slots[size_t(r)].size()); ++s) {
      EXPECT_EQ(slots[size_t(r)][size_t(s)], s + 1 < m.switched_at_step ? 16 : 24)
          << "rank " << r << " after step " << s + 1;
    }
  }
}

}  // namespace
}  // namespace moeserve
