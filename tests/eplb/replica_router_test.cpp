// ReplicaRouter (replica choice per token) and the before/after GPU loads.
#include "eplb/replica_router.h"

#include <map>
#include <random>

#include <gtest/gtest.h>

#include "eplb/gpu_load.h"
#include "eplb/rebalance.h"

namespace moeserve::eplb {
namespace {

Placement readme_plan() {
  auto loads = make_expert_loads({{90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86},
                                  {20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27}});
  auto plan = rebalance_experts(*loads, {16, 4, 2, 8});
  EXPECT_TRUE(plan.ok());
  return *plan;
}

// Under uniform traffic from all ranks, each replica of e receives exactly 1/logcnt(e) of it,
// a rank holding a replica with room sends there, and no rank leaves its node while a replica
// on its node has room.
void expect_router_properties(const Placement& p) {
  const ReplicaRouter router(p);
  const int32_t G = p.num_gpus();
  for (int32_t l = 0; l < p.num_layers(); ++l) {
    for (int32_t e = 0; e < p.num_logical(); ++e) {
      const int32_t c = p.logcnt(l, e);
      std::map<int32_t, int32_t> received;  // slot -> units from all ranks
      for (int32_t g = 0; g < G; ++g) {
        int32_t sum = 0, local = 0, on_node = 0, local_slots = 0, node_slots = 0;
        for (const ReplicaShare& s : router.shares(l, e, g)) {
          ASSERT_GT(s.units, 0);
          ASSERT_EQ(p.phy2log(l, s.slot), e);
          sum += s.units;
          received[s.slot] += s.units;
          const int32_t gpu = p.gpu_of_slot(s.slot);
          if (gpu == g) local += s.units;
          if (p.node_of_gpu(gpu) == p.node_of_gpu(g)) on_node += s.units;
        }
        for (int32_t slot : p.replicas(l, e)) {
          local_slots += p.gpu_of_slot(slot) == g;
          node_slots += p.node_of_gpu(p.gpu_of_slot(slot)) == p.node_of_gpu(g);
        }
        ASSERT_EQ(sum, c) << "shares of a rank sum to logcnt";
        // Pass 1 runs first for every rank, so local replicas are never full yet for it
        // unless local capacity (local_slots * G) is below its own supply c.
        EXPECT_EQ(local, std::min(c, local_slots * G)) << "layer " << l << " expert " << e;
        if (node_slots > 0 && on_node < c) {
          // It left the node: then every replica on its node must be full (G units).
          for (int32_t slot : p.replicas(l, e)) {
            if (p.node_of_gpu(p.gpu_of_slot(slot)) == p.node_of_gpu(g)) {
              int32_t total = 0;
              for (int32_t h = 0; h < G; ++h) {
                for (const ReplicaShare& s : router.shares(l, e, h)) {
                  if (s.slot == slot) total += s.units;
                }
              }
              EXPECT_EQ(total, G);
            }
          }
        }
      }
      ASSERT_EQ(int32_t(received.size()), c) << "every replica gets traffic";
      for (const auto& [slot, units] : received) EXPECT_EQ(units, G) << "even split";
    }
  }
}

TEST(ReplicaRouter, ReadmePlan) {
  expect_router_properties(readme_plan());
}

TEST(ReplicaRouter, RandomPlans) {
  std::mt19937 rng(5);
  for (int t = 0; t < 40; ++t) {
    const int32_t nodes = 1 + t % 2, gpus = nodes * (1 + t % 4), experts = 16;
    std::vector<std::vector<double>> rows(2, std::vector<double>(experts));
    for (auto& row : rows) {
      for (double& v : row) v = std::exp(std::normal_distribution<double>(0, 2)(rng));
    }
    const int32_t groups = t % 3 == 0 ? 3 : 4;  // 3 % nodes != 0 when nodes = 2: global
    if (groups == 3 && nodes == 1) continue;    // 16 experts do not split into 3 groups
    auto plan = rebalance_experts(*make_expert_loads(rows),
                                  {(experts / gpus + 1 + t % 3) * gpus, groups, nodes, gpus});
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    expect_router_properties(*plan);
  }
}

TEST(ReplicaRouter, SelectFollowsSharesOverEveryLogcntTokens) {
  const Placement p = readme_plan();
  const ReplicaRouter router(p);
  for (int32_t g = 0; g < p.num_gpus(); ++g) {
    const int32_t c = p.logcnt(1, 8);  // expert 8 of layer 1 has 2 replicas
    ASSERT_EQ(c, 2);
    for (uint64_t start : {0ull, 5ull, 1000001ull}) {
      std::map<int32_t, int32_t> picked;
      for (uint64_t k = start; k < start + uint64_t(c); ++k) ++picked[router.select(1, 8, g, k)];
      for (const ReplicaShare& s : router.shares(1, 8, g)) EXPECT_EQ(picked[s.slot], s.units);
    }
  }
  // A rank holding the only replica always picks it.
  const int32_t slot = p.replicas(1, 0)[0];
  const int32_t gpu = p.gpu_of_slot(slot);
  for (uint64_t k = 0; k < 5; ++k) EXPECT_EQ(router.select(1, 0, gpu, k), slot);
}

TEST(GpuLoad, BeforeIsContiguousAndAfterSplitsReplicas) {
  auto loads = make_expert_loads({{8, 0, 2, 2, 4, 4}});
  // Before on 3 GPUs: {8,0} {2,2} {4,4}.
  EXPECT_EQ(gpu_loads_before(*loads, 0, 3), (std::vector<double>{8, 4, 8}));
  // 4 GPUs, E not a multiple: expert e on GPU floor(e * 4 / 6): 0,0,1,2,2,3.
  EXPECT_EQ(gpu_loads_before(*loads, 0, 4), (std::vector<double>{8, 2, 6, 4}));
  const LoadBalance b = summarize({8, 4, 8});
  EXPECT_DOUBLE_EQ(b.max, 8);
  EXPECT_DOUBLE_EQ(b.mean, 20.0 / 3);
  EXPECT_DOUBLE_EQ(b.imbalance(), 8 / (20.0 / 3));
  EXPECT_DOUBLE_EQ(summarize({0, 0}).imbalance(), 1.0);

  // 8 slots on 4 GPUs: expert 0 (load 8) gets the 2 extra slots (8/3 each); packing by hand:
  // 4(e4)->g0, 4(e5)->g1, 8/3->g2, 8/3->g3, 8/3->g2, 2(e2)->g3, 2(e3)->g0, 0(e1)->g1.
  auto plan = rebalance_experts(*loads, {8, 1, 1, 4});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->logcnt(0, 0), 3);
  const auto after = gpu_loads_after(*loads, *plan, 0);
  const std::vector<double> expect = {6, 4, 16.0 / 3, 14.0 / 3};
  ASSERT_EQ(after.size(), expect.size());
  for (size_t g = 0; g < expect.size(); ++g) EXPECT_NEAR(after[g], expect[g], 1e-12) << g;
  EXPECT_DOUBLE_EQ(summarize(after).mean, 5);
  EXPECT_LT(summarize(after).max, summarize(gpu_loads_before(*loads, 0, 4)).max);
}

}  // namespace
}  // namespace moeserve::eplb
