#include "sim/model_spec.h"

#include <gtest/gtest.h>

namespace moeserve::sim {
namespace {

TEST(ModelSpec, DeepSeekV3PresetMatchesConfigJson) {
  auto m = model_preset("deepseek-v3");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->hidden, 7168);
  EXPECT_EQ(m->layers, 61);
  EXPECT_EQ(m->moe_layers(), 58);
  EXPECT_EQ(m->kv_cache_width(), 576);
  EXPECT_EQ(m->qk_head_dim(), 192);
  EXPECT_EQ(m->experts_per_token, 8);
}

TEST(ModelSpec, ParsesHfConfigWithNullQLora) {
  const char* cfg = R"({"hidden_size": 2048, "num_hidden_layers": 27, "first_k_dense_replace": 1,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "vocab_size": 102400,
    "num_attention_heads": 16, "q_lora_rank": null, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128})";
  auto m = model_from_hf_config(cfg, "v2-lite");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->q_lora_rank, 0);
  EXPECT_EQ(m->mtp_layers, 0);
  EXPECT_EQ(m->moe_layers(), 26);
}

TEST(ModelSpec, RejectsBadInput) {
  EXPECT_FALSE(model_preset("llama").ok());
  EXPECT_FALSE(model_from_hf_config("not json", "x").ok());
  auto missing = model_from_hf_config(R"({"hidden_size": 8})", "x");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("num_hidden_layers"), std::string::npos);
  EXPECT_FALSE(load_model_spec("/nonexistent/config.json").ok());
}

}  // namespace
}  // namespace moeserve::sim
