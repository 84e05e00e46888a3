// DeepSeek-V4's counts in the cost model against hand arithmetic (docs/sim.md "DeepSeek-V4"),
// V4 config parsing, and that pricing V4 beside V3 leaves V3's figures as they were.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sim/layer_ops.h"
#include "sim/model_spec.h"
#include "sim/phase_model.h"
#include "sim/scenario.h"
#include "test_device.h"

namespace moeserve::sim {
namespace {

ModelSpec flash() {
  return model_preset("deepseek-v4-flash").value();
}
ModelSpec pro() {
  return model_preset("deepseek-v4-pro").value();
}

const OpCost& op(const std::vector<OpCost>& ops, const std::string& name) {
  for (const auto& o : ops) {
    if (o.name == name) return o;
  }
  ADD_FAILURE() << "no op " << name;
  static OpCost none;
  return none;
}

bool has_op(const std::vector<OpCost>& ops, const std::string& name) {
  for (const auto& o : ops) {
    if (o.name == name) return true;
  }
  return false;
}

TEST(V4Spec, PresetsMatchTheHubConfigs) {
  ModelSpec f = flash();
  EXPECT_TRUE(f.v4());
  EXPECT_EQ(f.sliding_layers + f.csa_layers + f.hca_layers, 43);
  EXPECT_EQ(f.csa_layers, 21);
  EXPECT_EQ(f.hca_layers, 20);
  EXPECT_EQ(f.routed_experts, 256);
  EXPECT_EQ(f.index_topk, 512);
  ModelSpec p = pro();
  EXPECT_EQ(p.sliding_layers, 0);
  EXPECT_EQ(p.csa_layers, 30);
  EXPECT_EQ(p.hca_layers, 31);
  EXPECT_EQ(p.routed_experts, 384);
  EXPECT_EQ(p.o_groups, 16);
  EXPECT_EQ(p.index_topk, 1024);
  // FP4 routed experts: half a byte per weight and one UE8M0 byte per 32.
  EXPECT_DOUBLE_EQ(p.routed_weight_bytes, 0.53125);
  EXPECT_DOUBLE_EQ(model_preset("deepseek-v3")->routed_weight_bytes, 1.0);
  // Cache formats: 448 e4m3 + 7 scale bytes + 64 BF16 rope; 128 FP4 + 4 scale bytes.
  EXPECT_DOUBLE_EQ(f.v4_entry_bytes(), 583);
  EXPECT_DOUBLE_EQ(f.v4_index_key_bytes(), 68);
}

TEST(V4Spec, ParsesTheHubConfigJson) {
  // V4-Flash's compress_ratios: [0, 0, (4, 128) x 20, 4, 0], the last one the MTP layer's.
  std::string ratios = "0, 0";
  for (int i = 0; i < 20; ++i) ratios += ", 4, 128";
  ratios += ", 4, 0";
  std::string cfg = R"({"model_type": "deepseek_v4", "hidden_size": 4096,
    "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1,
    "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8,
    "o_lora_rank": 1024, "sliding_window": 128, "compress_ratios": [)" +
                    ratios + R"(], "index_n_heads": 64, "index_head_dim": 128,
    "index_topk": 512, "hc_mult": 4, "n_routed_experts": 256, "num_experts_per_tok": 6,
    "n_shared_experts": 1, "moe_intermediate_size": 2048, "num_hash_layers": 3,
    "num_nextn_predict_layers": 1, "vocab_size": 129280, "expert_dtype": "fp4"})";
  auto m = model_from_hf_config(cfg, "v4-flash");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ModelSpec f = flash();
  EXPECT_TRUE(m->v4());
  EXPECT_EQ(m->sliding_layers, f.sliding_layers);
  EXPECT_EQ(m->csa_layers, f.csa_layers);
  EXPECT_EQ(m->hca_layers, f.hca_layers);
  EXPECT_EQ(m->mtp_compress_ratio, 0);
  EXPECT_EQ(m->hash_layers, 3);
  EXPECT_DOUBLE_EQ(m->routed_weight_bytes, f.routed_weight_bytes);
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(*m), kv_bytes_per_token(f));

  // transformers' spelling: layer_types, expert_dtype under quantization_config.
  std::string types = R"("sliding_attention", "heavily_compressed_attention",
    "compressed_sparse_attention")";
  std::string hf = R"({"model_type": "deepseek_v4", "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "qk_rope_head_dim": 8,
    "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16, "sliding_window": 16,
    "layer_types": [)" +
                   types + R"(], "index_n_heads": 8, "index_head_dim": 16,
    "index_topk": 4, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "vocab_size": 512,
    "quantization_config": {"expert_dtype": "fp8"}})";
  auto tiny = model_from_hf_config(hf, "tiny");
  ASSERT_TRUE(tiny.ok()) << tiny.status().to_string();
  EXPECT_EQ(tiny->sliding_layers, 1);
  EXPECT_EQ(tiny->csa_layers, 1);
  EXPECT_EQ(tiny->hca_layers, 1);
  EXPECT_DOUBLE_EQ(tiny->routed_weight_bytes, 1.0);

  // A ratio the model does not know, and a list of the wrong length, are errors.
  std::string bad = cfg;
  bad.replace(bad.find("[0, 0"), 5, "[0, 8");
  EXPECT_FALSE(model_from_hf_config(bad, "x").ok());
  std::string short_list = cfg;
  short_list.replace(short_list.find("[0, 0, "), 7, "[");
  EXPECT_FALSE(model_from_hf_config(short_list, "x").ok());
}

TEST(V4Counts, WindowCompressedAndIndexedEntriesByHand) {
  ModelSpec f = flash();
  // Decode at DeepSeek's 4,989-token average: 128 window keys, floor(4989/128) = 38 HCA
  // entries, floor(4989/4) = 1247 CSA entries scored and min(512, 1247) = 512 kept.
  V4Counts c = v4_counts(f, 4989);
  EXPECT_DOUBLE_EQ(c.window, 128);
  EXPECT_DOUBLE_EQ(c.hca, 38);
  EXPECT_DOUBLE_EQ(c.index, 1247);
  EXPECT_DOUBLE_EQ(c.csa, 512);
  // Short context: the window is the context, nothing complete in a 128-group.
  c = v4_counts(f, 100);
  EXPECT_DOUBLE_EQ(c.window, 100);
  EXPECT_DOUBLE_EQ(c.hca, 0);
  EXPECT_DOUBLE_EQ(c.csa, 25);
  // Causal prefill of 8 tokens: windows 1 + 2 + ... + 8 = 36; entries complete after tokens
  // 4 and 8: floor(p/4) over p = 1..8 = 0+0+0+1+1+1+1+2 = 6.
  c = v4_counts_causal(f, 0, 8);
  EXPECT_DOUBLE_EQ(c.window, 36);
  EXPECT_DOUBLE_EQ(c.index, 6);
  EXPECT_DOUBLE_EQ(c.csa, 6);
  EXPECT_DOUBLE_EQ(c.hca, 0);
  // After a 256-token cached prefix, 2 new tokens see 257 and 258 positions: 2 HCA entries each.
  c = v4_counts_causal(f, 256, 2);
  EXPECT_DOUBLE_EQ(c.window, 256);
  EXPECT_DOUBLE_EQ(c.hca, 4);
  EXPECT_DOUBLE_EQ(c.index, 128);
}

TEST(V4LayerOps, ProjectionAndExpertFlopsByHand) {
  // One V4-Flash CSA layer, 64 tokens, EP1: every weight once per token, 6 routed experts.
  // wq_a+wkv 1536*4096 = 6291456; compressor wkv+wgate (2x width) 2048*4096 = 8388608;
  // indexer weights_proj 64*4096 = 262144, its compressor 512*4096 = 2097152, its wq_b
  // 8192*1024 = 8388608; wq_b 32768*1024 = 33554432; wo_a 8 x 1024*4096 = 33554432; wo_b
  // 4096*8192 = 33554432; gate 256*4096 = 1048576; shared 3*2048*4096 = 25165824; routed
  // 6 x 25165824 = 150994944. Sum 303300608 (13B active over 43 layers is ~302M).
  const double t = 64;
  ModelSpec f = flash();
  MicroBatch mb{t, 1, 0, 0, false};
  mb.v4_pairs = v4_counts_causal(f, 0, t);
  auto ops = layer_ops(f, plain_device(), NodeSpec{}, ExpertLayout{}, mb, true, f.csa_ratio);
  double gemm = 0;
  for (const auto& o : ops) {
    if (o.comm || o.name.find("attention") != std::string::npos || o.name == "indexer scores" ||
        o.name == "mHC pre/post" || o.name == "compressor pooling" || o.name == "elementwise")
      continue;
    gemm += o.flops;
  }
  EXPECT_DOUBLE_EQ(gemm, 2 * t * 303300608.0);
  EXPECT_DOUBLE_EQ(op(ops, "wo_a (grouped)").flops, 2 * t * 33554432.0);
  // FP4 routed weights: 256 experts x 2*2048*4096 x 0.53125 bytes in gate+up.
  EXPECT_DOUBLE_EQ(op(ops, "routed gate+up").bytes,
                   256 * (4096.0 * 4096 * 0.53125 + t * 6 / 256 * 4096 + t * 6 / 256 * 4096 * 2));
  // mHC: mixes 2 x 2*24*16384 per token plus 2 x (16 + 32)*4096 weighted sums.
  EXPECT_DOUBLE_EQ(op(ops, "mHC pre/post").flops, t * (2 * 2 * 24 * 16384.0 + 2 * 48 * 4096.0));

  // An HCA layer has the compressor at 1x width and no indexer; a window layer neither.
  auto hca = layer_ops(f, plain_device(), NodeSpec{}, ExpertLayout{}, mb, true, f.hca_ratio);
  EXPECT_DOUBLE_EQ(op(hca, "compressor wkv+wgate").flops, 2 * t * 1024 * 4096);
  EXPECT_FALSE(has_op(hca, "indexer wq_b"));
  auto win = layer_ops(f, plain_device(), NodeSpec{}, ExpertLayout{}, mb, true, 0);
  EXPECT_FALSE(has_op(win, "compressor wkv+wgate"));
  EXPECT_FALSE(has_op(win, "indexer scores"));
}

TEST(V4LayerOps, DecodeAttentionFlopsAndBytesByHand) {
  // One sequence, one query token at 4,989 positions, V4-Flash CSA layer: 128 + 512 = 640
  // pairs, 2 * 640 * 64 heads * (512 + 512) FLOPs; reads 640 entries of 583 bytes plus q and
  // o (64 x 1024 BF16). The indexer scores 1247 keys: 2 * 1247 * 64 * (128 + 1) FLOPs, 1247 x 68
  // bytes.
  ModelSpec f = flash();
  V4Counts one = v4_counts(f, 4989);
  MicroBatch mb{1, 1, 4989, 4989, true};
  mb.v4_pairs = one;
  mb.v4_reads = one;
  auto ops = layer_ops(f, plain_device(), NodeSpec{}, ExpertLayout{}, mb, true, f.csa_ratio);
  EXPECT_DOUBLE_EQ(op(ops, "core_attention (V4 decode)").flops, 2.0 * 640 * 64 * 1024);
  EXPECT_DOUBLE_EQ(op(ops, "core_attention (V4 decode)").bytes, 640 * 583.0 + 64 * 1024 * 2.0);
  EXPECT_DOUBLE_EQ(op(ops, "indexer scores").flops, 2.0 * 1247 * 64 * 129);
  EXPECT_DOUBLE_EQ(op(ops, "indexer scores").bytes, 1247 * 68.0);
  // HCA: 128 + 38 entries.
  auto hca = layer_ops(f, plain_device(), NodeSpec{}, ExpertLayout{}, mb, true, f.hca_ratio);
  EXPECT_DOUBLE_EQ(op(hca, "core_attention (V4 decode)").flops, 2.0 * 166 * 64 * 1024);
}

TEST(V4Cache, BytesPerTokenAndPerSequenceByHand) {
  // Per token: CSA (583 + 68) / 4, HCA 583 / 128.
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(flash()), 21 * 651 / 4.0 + 20 * 583 / 128.0);  // 3508.84
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(pro()), 30 * 651 / 4.0 + 31 * 583 / 128.0);    // 5023.70
  // Per sequence: 43 + 1 MTP windows of 128 entries; CSA state 64 KiB + 16 KiB, HCA 512 KiB.
  EXPECT_DOUBLE_EQ(kv_bytes_per_sequence_fixed(flash()),
                   44 * 128 * 583.0 + 21 * 81920.0 + 20 * 524288.0);
  // V3 unchanged: 62 layers x 576 BF16, nothing fixed.
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(model_preset("deepseek-v3").value()), 62 * 576 * 2.0);
  EXPECT_DOUBLE_EQ(kv_bytes_per_sequence_fixed(model_preset("deepseek-v3").value()), 0);
}

constexpr char kExample[] = "examples/sim/deepseek-v3-h800-day.json";

TEST(V4PublishedDay, V3FiguresUnchanged) {
  auto s = load_scenario(kExample);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto r = run_scenario(*s);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // The figures docs/sim.md reports, as the model gave them before V4 was added.
  EXPECT_NEAR(r->prefill.forward_s, 1.9395135577643305, 1e-12);
  EXPECT_NEAR(r->prefill_input_tokens_per_s_per_node, 154468.1869625509, 1e-6);
  EXPECT_NEAR(r->decode.step_s, 0.0737025312755981, 1e-13);
  EXPECT_NEAR(r->decode_output_tokens_per_s_per_node, 26506.55230137001, 1e-6);
  EXPECT_DOUBLE_EQ(r->decode.batch, 132);
  EXPECT_DOUBLE_EQ(r->plan.avg_nodes, 132.25);
  EXPECT_DOUBLE_EQ(r->plan.peak_nodes, 172);
  EXPECT_DOUBLE_EQ(r->plan.daily_cost_usd, 50784);
  // Priced beside V4, V3's column is the same run.
  auto runs = run_models(*s, {"deepseek-v3", "deepseek-v4-flash", "deepseek-v4-pro"});
  ASSERT_TRUE(runs.ok()) << runs.status().to_string();
  ASSERT_EQ(runs->size(), 3u);
  const SimResult& v3 = (*runs)[0];
  EXPECT_DOUBLE_EQ(v3.prefill_input_tokens_per_s_per_node, r->prefill_input_tokens_per_s_per_node);
  EXPECT_DOUBLE_EQ(v3.decode_output_tokens_per_s_per_node, r->decode_output_tokens_per_s_per_node);
  EXPECT_DOUBLE_EQ(v3.plan.daily_cost_usd, r->plan.daily_cost_usd);
  // Same traffic, same revenue for every model.
  for (const auto& run : *runs) {
    EXPECT_DOUBLE_EQ(run.plan.daily_revenue_usd, r->plan.daily_revenue_usd);
    EXPECT_GT(run.plan.daily_cost_usd, 0);
    EXPECT_GE(run.decode.user_tokens_per_s, 20);
  }
}

TEST(V4PublishedDay, RedundantExpertsFillEveryDevice) {
  auto s = load_scenario(kExample);
  ASSERT_TRUE(s.ok());
  // V3 and V4-Flash (256 experts): 256 + 32 = 288 slots split over EP32 (9) and EP144 (2).
  auto f = with_model(*s, "deepseek-v4-flash");
  ASSERT_TRUE(f.ok());
  EXPECT_DOUBLE_EQ(f->prefill.redundant_experts, 32);
  EXPECT_DOUBLE_EQ(f->decode.redundant_experts, 32);
  // V4-Pro (384): 416 slots are 13 per GPU at EP32, but at EP144 they need 432 (3 per GPU).
  auto p = with_model(*s, "deepseek-v4-pro");
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ(p->prefill.redundant_experts, 32);
  EXPECT_DOUBLE_EQ(p->decode.redundant_experts, 48);
  // The trace-calibrated scenario measures V3: refused for another model.
  auto cal = load_scenario("examples/sim/deepseek-v3-h800-day-profiled.json");
  ASSERT_TRUE(cal.ok());
  EXPECT_FALSE(with_model(*cal, "deepseek-v4-flash").ok());
}

}  // namespace
}  // namespace moeserve::sim
