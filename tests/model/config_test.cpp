#include "model/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace moeserve {
namespace {

using json = nlohmann::json;

// DeepSeek-V3's published config.json (the fields this parser reads).
json v3_config() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": true,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "tie_word_embeddings": false,
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]}})");
}

TEST(ModelConfig, ParsesDeepSeekV3) {
  auto c = parse_model_config(v3_config().dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->model_type, "deepseek_v3");
  EXPECT_EQ(c->num_hidden_layers, 61);
  EXPECT_EQ(*c->q_lora_rank, 1536);
  EXPECT_EQ(c->topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c->scoring_func, ScoringFunc::kSigmoid);
  EXPECT_EQ(c->kv_cache_dim(), 576);
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  ASSERT_TRUE(c->rope_scaling);
  EXPECT_EQ(c->rope_scaling->factor, 40.0);
  ASSERT_TRUE(c->quant);
  EXPECT_EQ(c->quant->block_n, 128);
  EXPECT_FALSE(c->is_moe_layer(2));
  EXPECT_TRUE(c->is_moe_layer(3));
  // 192^-0.5 * (0.1 * 1.0 * ln 40 + 1)^2, as DeepSeek's model.py computes it.
  double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c->softmax_scale(), m * m / std::sqrt(192.0), 1e-12);
}

TEST(ModelConfig, V2LiteHasPlainQueryProjection) {
  json j = v3_config();
  j["model_type"] = "deepseek_v2";
  j["q_lora_rank"] = nullptr;
  j["topk_method"] = "greedy";
  j["scoring_func"] = "softmax";
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j.erase("rope_scaling");
  auto c = parse_model_config(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->q_lora_rank);
  EXPECT_EQ(c->topk_method, TopkMethod::kGreedy);
  EXPECT_FALSE(c->rope_scaling);
  EXPECT_DOUBLE_EQ(c->softmax_scale(), 1.0 / std::sqrt(192.0));
}

// Each bad field gives an error naming that field.
TEST(ModelConfig, BadFieldsAreNamed) {
  struct Case {
    std::string key;
    json value;  // null: remove the key
  };
  std::vector<Case> cases = {
      {"hidden_size", nullptr},     {"hidden_size", -5},     {"hidden_size", "big"},
      {"kv_lora_rank", 0},          {"topk_method", "best"}, {"scoring_func", "relu"},
      {"num_experts_per_tok", 300}, {"n_group", 7},          {"topk_group", 9},
      {"qk_rope_head_dim", 63},     {"model_type", "llama"}, {"vocab_size", nullptr},
      {"norm_topk_prob", "yes"},    {"hidden_act", "gelu"},
  };
  for (const Case& k : cases) {
    json j = v3_config();
    if (k.value.is_null()) {
      j.erase(k.key);
    } else {
      j[k.key] = k.value;
    }
    auto c = parse_model_config(j.dump(), "dir/config.json");
    ASSERT_FALSE(c.ok()) << k.key << "=" << k.value.dump();
    EXPECT_NE(c.status().message().find(k.key), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("dir/config.json"), std::string::npos);
  }
}

TEST(ModelConfig, UnsupportedQuantizationIsRefused) {
  json j = v3_config();
  j["quantization_config"]["quant_method"] = "gptq";
  auto c = parse_model_config(j.dump(), "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("quantization_config"), std::string::npos);
}

TEST(ModelConfig, NotJson) {
  auto c = parse_model_config("{\"model_type\": ", "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("config.json"), std::string::npos);
  EXPECT_FALSE(load_model_config("/nonexistent/config.json").ok());
}

TEST(ModelConfig, RoundTripsThroughJson) {
  auto c = parse_model_config(v3_config().dump(), "a");
  ASSERT_TRUE(c.ok());
  auto d = parse_model_config(model_config_to_json(*c), "b");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(model_config_to_json(*c), model_config_to_json(*d));
}

}  // namespace
}  // namespace moeserve
