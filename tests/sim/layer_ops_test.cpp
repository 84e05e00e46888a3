// Cost terms of one layer checked against hand arithmetic (docs/sim.md shows the same sums).
#include "sim/layer_ops.h"

#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "test_device.h"

namespace moeserve::sim {
namespace {

ModelSpec v3() {
  return model_preset("deepseek-v3").value();
}

double flops_of(const std::vector<OpCost>& ops, const std::string& name) {
  for (const auto& op : ops) {
    if (op.name == name) return op.flops;
  }
  ADD_FAILURE() << "no op " << name;
  return 0;
}

TEST(LayerOps, DensePrefillLayerFlopsByHand) {
  // One dense layer, 64 new tokens, no context: every weight is used once per token.
  // MLA weights: q_a 7168*1536 + q_b 1536*24576 + kv_a 7168*576 + kv_b 512*32768 + o 16384*7168
  //            = 11010048 + 37748736 + 4128768 + 16777216 + 117440512 = 187105280.
  // MLP: 3 * 7168 * 18432 = 396361728.
  const double t = 64;
  MicroBatch mb{t, 1, 0, 0, false};
  auto ops = layer_ops(v3(), plain_device(), NodeSpec{}, ExpertLayout{}, mb, /*moe=*/false);
  double gemm = 0;
  for (const auto& op : ops) {
    if (!op.comm && op.name.find("attention") == std::string::npos) gemm += op.flops;
  }
  EXPECT_DOUBLE_EQ(gemm, 2 * t * (187105280.0 + 396361728.0));
  EXPECT_DOUBLE_EQ(flops_of(ops, "q_a+kv_a_proj"), 2 * t * 2112 * 7168);
}

TEST(LayerOps, AttentionFlopsByHand) {
  // Decode, absorbed: per (query, key) pair 2 * 128 heads * (576 + 512) = 278528 FLOPs
  // (FlashMLA's benchmark counts the same). Prefill, naive: 2 * 128 * (192 + 128) = 81920.
  MicroBatch dec{2, 1, 2 * 4096.0, 4096, true};
  auto d = layer_ops(v3(), plain_device(), NodeSpec{}, ExpertLayout{}, dec, false);
  EXPECT_DOUBLE_EQ(flops_of(d, "core_attention (MLA decode)"), 2 * 4096.0 * 278528);
  MicroBatch pre{100, 1, 100 * 101 / 2.0, 0, false};  // causal: token i sees i positions
  auto p = layer_ops(v3(), plain_device(), NodeSpec{}, ExpertLayout{}, pre, false);
  EXPECT_DOUBLE_EQ(flops_of(p, "core_attention (MHA prefill)"), 5050.0 * 81920);
}

TEST(LayerOps, RoutedExpertsSpreadOverSlots) {
  // EP144 with 256 + 32 slots: 2 experts per GPU; each gets 144 * T * 8 / 288 = 4T tokens.
  ExpertLayout e{144, 32, 8, CommMode::kLowLatency};
  EXPECT_DOUBLE_EQ(experts_per_device(v3(), e), 2);
  EXPECT_DOUBLE_EQ(tokens_per_expert(v3(), e, 100), 400);
  // EP32 prefill: 9 per GPU.
  EXPECT_DOUBLE_EQ(experts_per_device(v3(), ExpertLayout{32, 32, 8, CommMode::kNormal}), 9);
}

TEST(LayerOps, AllToAllVolumesReproduceDeepEPLatencies) {
  // DeepEP's low-latency table (H800, EP128, 128 tokens, top-8, hidden 7168): dispatch 192 us at
  // 39 GB/s, combine 369 us at 39 GB/s. Our byte counts at the same bandwidth land within 3%.
  ExpertLayout e{128, 0, 8, CommMode::kLowLatency};
  double disp = dispatch_bytes(v3(), e, 128);
  double comb = combine_bytes(v3(), e, 128);
  EXPECT_DOUBLE_EQ(disp, 128.0 * 8 * 7168 * (1 + 4.0 / 128));
  EXPECT_DOUBLE_EQ(comb, 128.0 * 8 * 7168 * 2);
  EXPECT_NEAR(disp / 39e9 * 1e6, 192, 192 * 0.03);
  EXPECT_NEAR(comb / 39e9 * 1e6, 369, 369 * 0.03);
  // Normal kernels send once per node: 4 nodes, top-8 uniform: 4 * (1 - (3/4)^8) nodes.
  EXPECT_NEAR(expected_nodes_touched(4, 8), 3.59955, 1e-5);
  EXPECT_DOUBLE_EQ(expected_nodes_touched(1, 8), 1);
}

TEST(Hardware, GemmTableLookup) {
  DeviceSpec d = plain_device();
  d.gemm_dense = {{64, 7168, 2048, 295}, {128, 7168, 2048, 510}, {4096, 7168, 2048, 1025}};
  auto secs = [&](double m) { return fp8_gemm_seconds(d, GemmKind::kDense, {m, 7168, 2048}); };
  // At a tabulated shape the time is FLOPs / published TFLOPS.
  EXPECT_DOUBLE_EQ(secs(128), 2.0 * 128 * 7168 * 2048 / 510e12);
  // Halfway in log(m) between 128 and 4096 (m = 724.08...): TFLOPS halfway too.
  double m = std::sqrt(128.0 * 4096.0);
  EXPECT_NEAR(secs(m), 2.0 * m * 7168 * 2048 / ((510 + 1025) / 2.0 * 1e12), 1e-12);
  // Below the table: weight-bound, time scales with bytes moved, so m=1 costs almost m=64's time.
  EXPECT_LT(secs(1), secs(64));
  EXPECT_GT(secs(1), 0.8 * secs(64));
  // A shape the table lacks: roofline at the fallback fractions.
  GemmShape other{4096, 1000, 1000};
  double expect = std::max(gemm_flops(other) / (2000e12 * 0.5), gemm_bytes(other, 1, 1) / 3000e9);
  EXPECT_DOUBLE_EQ(fp8_gemm_seconds(d, GemmKind::kDense, other), expect);
  // Grouped: the masked table falls back to the dense rows of the same (n, k).
  EXPECT_DOUBLE_EQ(fp8_gemm_seconds(d, GemmKind::kGroupedMasked, {128, 7168, 2048, 2}),
                   2 * secs(128));
}

TEST(Hardware, CommTableInterpolatesInLogEp) {
  NodeSpec n;
  n.devices = 8;
  n.scale_up_bw = 160e9;
  n.scale_out_bw = 50e9;
  n.comm_eff = 0.5;
  n.comm_low_latency = {{64, 43e9, 46e9}, {256, 39e9, 40e9}};
  EXPECT_DOUBLE_EQ(dispatch_bw(n, CommMode::kLowLatency, 128), 41e9);  // log-midpoint
  EXPECT_DOUBLE_EQ(combine_bw(n, CommMode::kLowLatency, 512), 40e9);   // clamped
  // No table: the link the EP group crosses, times comm_eff.
  EXPECT_DOUBLE_EQ(dispatch_bw(n, CommMode::kNormal, 8), 80e9);
  EXPECT_DOUBLE_EQ(dispatch_bw(n, CommMode::kNormal, 16), 25e9);
}

}  // namespace
}  // namespace moeserve::sim
