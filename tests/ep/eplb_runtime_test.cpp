// EPLB at run time, at the dispatcher level (in-process groups, ranks as threads): placements
// with redundant experts that differ per MoE layer, the replica choice, load counting, and the
// balance the plan predicts against the balance measured on skewed routing.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "ep/ep_dispatcher.h"
#include "ep/expert_balancer.h"
#include "ep/expert_load_counter.h"
#include "ep_test_util.h"
#include "eplb/gpu_load.h"

namespace moeserve {
namespace {

using namespace ep_testing;

// Tokens whose K distinct experts are drawn with probability proportional to weight[e].
Tokens skewed_tokens(int64_t n, uint32_t seed, const std::vector<double>& weight) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unif(0.05f, 1.0f);
  Tokens t;
  t.n = n;
  for (int64_t i = 0; i < n * H; ++i) t.x.push_back(normal(rng));
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> w = weight;
    for (int64_t j = 0; j < K; ++j) {
      std::discrete_distribution<int32_t> pick(w.begin(), w.end());
      int32_t e = pick(rng);
      w[size_t(e)] = 0;  // distinct experts per token
      t.ids.push_back(e);
      t.w.push_back(unif(rng));
    }
  }
  return t;
}

// Hot experts: 0..3 in layer 0, 8..11 in layer 1 (so the plans of the two layers differ).
std::vector<double> hot_weights(int64_t layer, double hot) {
  std::vector<double> w(size_t(E), 1.0);
  for (int32_t e = 0; e < 4; ++e) w[size_t(layer == 0 ? e : e + 8)] = hot;
  return w;
}

eplb::ExpertLoads loads_of(const std::vector<std::vector<double>>& rows) {
  return *eplb::make_expert_loads(rows);
}

TEST(ExpertPlacement, FromPlanHoldsEachSlotsExpertAndRoutesToACopy) {
  const int R = 4;
  std::vector<double> l0 = hot_weights(0, 10), l1 = hot_weights(1, 10);
  auto plan = moeserve::plan(loads_of({l0, l1}), R, {.redundant_experts = 8, .groups = 4});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  auto p = ExpertPlacement::from_plan(*plan);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->per_layer());
  EXPECT_EQ(p->layers(), 2);
  EXPECT_EQ(p->n_slots(), 24);
  EXPECT_FALSE(p->valid_layer(2));
  bool layers_differ = false;
  for (int64_t l = 0; l < 2; ++l) {
    for (int r = 0; r < R; ++r) {
      std::set<int32_t> expected;
      for (int32_t s = r * 6; s < (r + 1) * 6; ++s) expected.insert(plan->phy2log(int32_t(l), s));
      const auto& held = p->experts_on(l, r);
      EXPECT_EQ(std::set<int32_t>(held.begin(), held.end()), expected);
      EXPECT_TRUE(std::is_sorted(held.begin(), held.end()));
      for (int32_t e = 0; e < E; ++e) {
        EXPECT_EQ(p->holds(l, r, e), expected.count(e) == 1);
        if (p->holds(l, r, e)) {
          EXPECT_EQ(held[size_t(p->local_index(l, r, e))], e);
        }
      }
      layers_differ |= p->experts_on(0, r) != p->experts_on(1, r);
    }
    for (int32_t e = 0; e < E; ++e) {
      EXPECT_EQ(p->replicas(l, e), plan->logcnt(int32_t(l), e));
      // Equal traffic from every rank (c * 4 tokens each) splits exactly by slots: a rank with
      // m of the c copies computes m / c of it.
      const int32_t c = p->replicas(l, e);
      std::vector<int64_t> got(static_cast<size_t>(R), 0);
      for (int src = 0; src < R; ++src) {
        for (uint64_t seq = 0; seq < uint64_t(c) * 4; ++seq) {
          const int dst = p->route(l, e, src, seq);
          ASSERT_TRUE(p->holds(l, dst, e)) << "layer " << l << " expert " << e;
          if (p->holds(l, src, e)) {
            EXPECT_EQ(dst, src) << "a local copy is preferred";
          }
          ++got[size_t(dst)];
        }
      }
      for (int r = 0; r < R; ++r) {
        int64_t slots = 0;
        for (int32_t s = r * 6; s < (r + 1) * 6; ++s) slots += plan->phy2log(int32_t(l), s) == e;
        EXPECT_EQ(got[size_t(r)], slots * R * 4) << "layer " << l << " expert " << e;
      }
    }
  }
  EXPECT_TRUE(layers_differ) << "hot experts differ per layer, so should the placements";
  // The hot experts got the redundant slots.
  for (int32_t e = 0; e < 4; ++e) EXPECT_GT(p->replicas(0, e), 1);
  EXPECT_EQ(p->replicas(0, 12), 1);
}

struct LayerStep {
  int64_t layer;
  std::vector<Tokens> per_rank;
};

struct RankRun {
  std::vector<Result<std::vector<float>>> y;  // per step
  std::vector<int64_t> rows;                  // per step: rows this rank's experts computed
  std::vector<std::vector<int32_t>> experts;  // per step: experts with rows here
};

// Runs the steps on every rank with `placement`; counts into per-rank counters when given.
std::vector<RankRun> run_layers(int R, const ExpertPlacement& placement, EpOptions options,
                                const std::vector<LayerStep>& steps,
                                std::vector<std::unique_ptr<ExpertLoadCounter>>* counters = nullptr,
                                std::vector<Result<GroupLoads>>* gathered = nullptr) {
  auto group = make_in_process_group(R, CommOptions{std::chrono::milliseconds(20000)});
  std::vector<RankRun> out(static_cast<size_t>(R));
  if (gathered) gathered->assign(size_t(R), Internal("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) {
    threads.emplace_back([&, r] {
      auto d = EpDispatcher::create(*group[size_t(r)], placement, options);
      if (d.ok() && counters) (*d)->set_load_counter((*counters)[size_t(r)].get());
      for (const LayerStep& st : steps) {
        if (!d.ok()) {
          out[size_t(r)].y.push_back(d.status());
          continue;
        }
        const Tokens& t = st.per_rank[size_t(r)];
        auto b = (*d)->dispatch(st.layer, t.x.data(), t.n, H, t.ids.data(), t.w.data(), K);
        if (!b.ok()) {
          out[size_t(r)].y.push_back(b.status());
          continue;
        }
        int64_t rows = 0;
        for (int64_t c : b->counts) rows += c;
        out[size_t(r)].rows.push_back(rows);
        std::vector<int32_t> used;
        for (size_t s = 0; s < b->experts.size(); ++s) {
          if (b->counts[s] > 0) used.push_back(b->experts[s]);
        }
        out[size_t(r)].experts.push_back(used);
        std::vector<float> o = run_experts(*b);
        std::vector<float> y(size_t(t.n * H));
        Status s = (*d)->combine(*b, o.data(), y.data());
        out[size_t(r)].y.push_back(s.ok() ? Result<std::vector<float>>(std::move(y))
                                          : Result<std::vector<float>>(s));
      }
      if (counters && gathered) {
        (*counters)[size_t(r)]->flush();
        (*gathered)[size_t(r)] = (*counters)[size_t(r)]->gather(*group[size_t(r)]);
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// Two "forward passes" over two MoE layers with skewed routing, every rank its own tokens.
std::vector<LayerStep> skewed_steps(int R, int64_t tokens_per_rank, double hot, uint32_t seed) {
  std::vector<LayerStep> steps;
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t l = 0; l < 2; ++l) {
      LayerStep st{l, {}};
      for (int r = 0; r < R; ++r) {
        st.per_rank.push_back(skewed_tokens(
            tokens_per_rank + r, seed + uint32_t(100 * pass + 10 * l + r), hot_weights(l, hot)));
      }
      steps.push_back(std::move(st));
    }
  }
  return steps;
}

TEST(EpDispatcherWithReplicas, SameBitsAsWithoutEplbAndAsTheEmulation) {
  for (int R : {2, 4}) {
    auto plan = moeserve::plan(loads_of({hot_weights(0, 10), hot_weights(1, 10)}), R,
                               {.redundant_experts = 8, .groups = 4});
    ASSERT_TRUE(plan.ok());
    const ExpertPlacement eplb = *ExpertPlacement::from_plan(*plan);
    const ExpertPlacement plain = *ExpertPlacement::contiguous(E, R);
    auto steps = skewed_steps(R, 12, 10, 7);
    for (auto [mode, dt] : {std::pair{EpMode::kNormal, DispatchDType::kFp8},
                            std::pair{EpMode::kLowLatency, DispatchDType::kBf16},
                            std::pair{EpMode::kNormal, DispatchDType::kF32}}) {
      EpOptions o{dt, mode, H, K, 16};
      auto with = run_layers(R, eplb, o, steps);
      auto without = run_layers(R, plain, o, steps);
      std::map<int32_t, std::set<int>> computed_on;  // layer-0 expert -> ranks that computed it
      for (int r = 0; r < R; ++r) {
        for (size_t s = 0; s < steps.size(); ++s) {
          const std::string what = fmt::format("R {} {} {} rank {} step {}", R, ep_mode_name(mode),
                                               dispatch_dtype_name(dt), r, s);
          ASSERT_TRUE(with[size_t(r)].y[s].ok())
              << what << with[size_t(r)].y[s].status().to_string();
          ASSERT_TRUE(without[size_t(r)].y[s].ok()) << what;
          EXPECT_EQ(*with[size_t(r)].y[s], *without[size_t(r)].y[s]) << what;
          EXPECT_EQ(*with[size_t(r)].y[s], emulate(steps[s].per_rank[size_t(r)], dt)) << what;
          if (steps[s].layer == 0) {
            for (int32_t e : with[size_t(r)].experts[s]) computed_on[e].insert(r);
          }
        }
      }
      // Redundant copies were used: some hot expert was computed on more than one rank.
      size_t most = 0;
      for (int32_t e = 0; e < 4; ++e) most = std::max(most, computed_on[e].size());
      EXPECT_GT(most, 1u) << "R " << R;
    }
  }
}

TEST(EpDispatcherWithReplicas, RejectsALayerOutsideThePlan) {
  auto plan = moeserve::plan(loads_of({hot_weights(0, 10)}), 1, {.redundant_experts = 2});
  ASSERT_TRUE(plan.ok());
  auto group = make_in_process_group(1);
  auto d = EpDispatcher::create(*group[0], *ExpertPlacement::from_plan(*plan), {});
  ASSERT_TRUE(d.ok());
  Tokens t = random_tokens(3, 1, any_expert);
  EXPECT_TRUE((*d)->dispatch(0, t.x.data(), t.n, H, t.ids.data(), t.w.data(), K).ok());
  auto bad = (*d)->dispatch(1, t.x.data(), t.n, H, t.ids.data(), t.w.data(), K);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE((*d)->holds_layer_expert(1, 0));
  EXPECT_FALSE((*d)->set_placement(*ExpertPlacement::contiguous(8, 1)).ok());
}

TEST(ExpertLoadCounter, CountsStepsByLayerOrderAndSumsOverRanks) {
  const int R = 4;
  std::vector<std::unique_ptr<ExpertLoadCounter>> counters;
  for (int r = 0; r < R; ++r) counters.push_back(std::make_unique<ExpertLoadCounter>(2, E, R, 100));
  std::vector<Result<GroupLoads>> gathered;
  auto steps = skewed_steps(R, 9, 5, 3);
  const ExpertPlacement placement = *ExpertPlacement::contiguous(E, R);
  auto runs = run_layers(R, placement, {DispatchDType::kBf16, EpMode::kNormal}, steps, &counters,
                         &gathered);
  eplb::ExpertLoads tokens(2, E), rows(2, R);
  for (const LayerStep& st : steps) {
    for (const Tokens& t : st.per_rank) {
      for (int32_t e : t.ids) tokens.at(int32_t(st.layer), e) += 1;
    }
  }
  for (int r = 0; r < R; ++r) {
    for (size_t s = 0; s < steps.size(); ++s) {
      rows.at(int32_t(steps[s].layer), r) += double(runs[size_t(r)].rows[s]);
    }
  }
  for (int r = 0; r < R; ++r) {
    ASSERT_TRUE(gathered[size_t(r)].ok()) << gathered[size_t(r)].status().to_string();
    const GroupLoads& g = *gathered[size_t(r)];
    EXPECT_EQ(counters[size_t(r)]->steps_completed(), 2) << "two passes over layers 0, 1";
    EXPECT_EQ(g.steps, 2);
    EXPECT_EQ(g.tokens.tokens, tokens.tokens) << "tokens per expert, summed over ranks";
    EXPECT_EQ(g.rank_rows.tokens, rows.tokens) << "rows each rank computed";
    // Contiguous placement: each rank's rows are its experts' tokens (eplb's "before").
    for (int32_t l = 0; l < 2; ++l) {
      EXPECT_EQ(eplb::gpu_loads_before(g.tokens, l, R),
                std::vector<double>(g.rank_rows.layer(l).begin(), g.rank_rows.layer(l).end()));
    }
  }
}

TEST(ExpertLoadCounter, WindowAndExplicitSteps) {
  ExpertLoadCounter c(2, 4, 2, /*window_steps=*/2);
  std::vector<int32_t> ids = {0, 1, 1, 3}, dest = {0, 0, 1, 1};
  for (int step = 0; step < 3; ++step) {
    c.on_dispatch(0, ids, dest);
    c.on_dispatch(1, ids, dest);
    c.end_step();
    c.end_step();  // a second call without dispatches closes nothing
  }
  EXPECT_EQ(c.steps_completed(), 3);
  EXPECT_EQ(c.tokens().steps_in_window(), 2);
  EXPECT_EQ(c.tokens().window_totals().at(1, 1), 4);  // 2 per step, 2 steps in the window
  EXPECT_EQ(c.sent().window_totals().at(0, 1), 4);
  ExpertLoadCounter single(1, 4, 2, 10);  // one MoE layer: every dispatch begins a step
  single.on_dispatch(0, ids, dest);
  single.on_dispatch(0, ids, dest);
  single.flush();
  EXPECT_EQ(single.steps_completed(), 2);
}

// The figure of issue 8 at the dispatcher level: skewed routing at R = 4, contiguous placement
// vs the EPLB plan of the measured loads. The measured max/mean rows per rank after must be
// within 10% of what the plan predicts, and below the imbalance before.
TEST(EpDispatcherWithReplicas, MeasuredBalanceAfterRebalanceMatchesThePlan) {
  const int R = 4;
  auto steps = skewed_steps(R, 40, 8, 11);
  std::vector<std::unique_ptr<ExpertLoadCounter>> c1, c2;
  for (int r = 0; r < R; ++r) {
    c1.push_back(std::make_unique<ExpertLoadCounter>(2, E, R, 100));
    c2.push_back(std::make_unique<ExpertLoadCounter>(2, E, R, 100));
  }
  std::vector<Result<GroupLoads>> g1, g2;
  EpOptions o{DispatchDType::kBf16, EpMode::kNormal};
  run_layers(R, *ExpertPlacement::contiguous(E, R), o, steps, &c1, &g1);
  ASSERT_TRUE(g1[0].ok());
  const BalancerOptions bo{.redundant_experts = 8, .groups = 4};
  auto plan = moeserve::plan(g1[0]->tokens, R, bo);
  ASSERT_TRUE(plan.ok());
  run_layers(R, *ExpertPlacement::from_plan(*plan), o, steps, &c2, &g2);
  ASSERT_TRUE(g2[0].ok());
  EXPECT_EQ(g2[0]->tokens.tokens, g1[0]->tokens.tokens) << "routing does not depend on placement";
  for (int32_t l = 0; l < 2; ++l) {
    const double before = rank_imbalance(g1[0]->rank_rows, l);
    const double predicted =
        eplb::summarize(eplb::gpu_loads_after(g1[0]->tokens, *plan, l)).imbalance();
    const double after = rank_imbalance(g2[0]->rank_rows, l);
    EXPECT_LT(after, before) << "layer " << l;
    EXPECT_LE(after, predicted * 1.10) << "layer " << l << ": predicted " << predicted;
    EXPECT_GT(before, 1.5) << "the routing is skewed";
  }
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

using namespace ep_testing;

// The online path the server will drive: ExpertBalancer counts, and every `interval` steps
// (collectively) plans from the group's window and switches the dispatcher's placement before
// the next step; the ExpertSource hook sees the new placement first. Results stay exact.
TEST(ExpertBalancer, RebalancesEveryIntervalAndKeepsResultsExact) {
  const int R = 4;
  auto steps = skewed_steps(R, 20, 8, 21);  // two passes over MoE layers 0, 1
  auto group = make_in_process_group(R, CommOptions{std::chrono::milliseconds(20000)});
  std::vector<std::string> errors(static_cast<size_t>(R));
  std::vector<int> sources_called(static_cast<size_t>(R), 0);
  std::vector<int64_t> slots_after(static_cast<size_t>(R), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const std::string& what) { errors[size_t(r)] += what + "; "; };
      auto d = EpDispatcher::create(*group[size_t(r)], *ExpertPlacement::contiguous(E, R),
                                    {DispatchDType::kF32, EpMode::kNormal});
      if (!d.ok()) return fail(d.status().to_string());
      BalancerOptions bo{
          .redundant_experts = 8, .groups = 4, .window_steps = 10, .interval_steps = 1};
      ExpertSource source = [&, r](const ExpertPlacement& next) {
        ++sources_called[size_t(r)];
        return next.n_slots() == 24 ? Status::Ok() : Internal("unexpected placement");
      };
      auto b = ExpertBalancer::create(*group[size_t(r)], **d, 2, bo, source);
      if (!b.ok()) return fail(b.status().to_string());
      for (size_t s = 0; s < steps.size(); ++s) {
        const Tokens& t = steps[s].per_rank[size_t(r)];
        auto batch =
            (*d)->dispatch(steps[s].layer, t.x.data(), t.n, H, t.ids.data(), t.w.data(), K);
        if (!batch.ok()) return fail(batch.status().to_string());
        std::vector<float> o = run_experts(*batch), y(size_t(t.n * H));
        if (Status st = (*d)->combine(*batch, o.data(), y.data()); !st.ok())
          return fail(st.to_string());
        if (y != emulate(t, DispatchDType::kF32)) fail("step " + std::to_string(s) + " differs");
        if (steps[s].layer == 1) {  // the end of a forward pass
          auto changed = (*b)->end_step();
          if (!changed.ok()) return fail(changed.status().to_string());
          if (!*changed) fail("interval 1 should rebalance after every step");
        }
      }
      slots_after[size_t(r)] = (*d)->placement().n_slots();
      if ((*b)->rebalances() != 2) fail("two rebalances");
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(sources_called[size_t(r)], 2);
    EXPECT_EQ(slots_after[size_t(r)], 24);
  }
}

}  // namespace
}  // namespace moeserve
