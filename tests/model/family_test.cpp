// Model families (model/family.h) and the one bring-up (model/loaded_model.h).
#include "model/family.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/fingerprint.h"
#include "model/loaded_model.h"
#include "model/make_model.h"
#include "test_models.h"

namespace moeserve {
namespace {

TEST(ModelFamily, V32IsAFamilyOfItsOwn) {
  const std::vector<std::string> arch = {"DeepseekV32ForCausalLM"};
  auto f = find_model_family("deepseek_v32", arch, "config.json");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->name, "deepseek_v32");
}

TEST(ModelFamily, V4IsAFamilyOfItsOwn) {
  const std::vector<std::string> arch = {"DeepseekV4ForCausalLM"};
  auto f = find_model_family("deepseek_v4", arch, "config.json");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->name, "deepseek_v4");
}

TEST(ModelFamily, V3AndV2AreTheFirstFamily) {
  for (const char* type : {"deepseek_v3", "deepseek_v2"}) {
    auto f = find_model_family(type, {}, "config.json");
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ((*f)->name, "deepseek_v3");
  }
  const std::vector<std::string> v2 = {"DeepseekV2ForCausalLM"};
  EXPECT_TRUE(find_model_family("deepseek_v2", v2, "config.json").ok());
}

// An architecture no family runs is refused by name, with the list of what is supported.
TEST(ModelFamily, AnUnsupportedModelTypeNamesItselfAndTheSupportedOnes) {
  const std::vector<std::string> arch = {"DeepseekV5ForCausalLM"};
  auto f = find_model_family("deepseek_v5", arch, "m/config.json");
  ASSERT_FALSE(f.ok());
  const std::string& m = f.status().message();
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  for (const char* want : {"m/config.json", "'deepseek_v5'", "DeepseekV5ForCausalLM", "supported",
                           "deepseek_v3", "deepseek_v2", "deepseek_v32", "deepseek_v4"}) {
    EXPECT_NE(m.find(want), std::string::npos) << want << " in: " << m;
  }
  // A known model_type with another family's architecture.
  const std::vector<std::string> llama = {"LlamaForCausalLM"};
  auto g = find_model_family("deepseek_v3", llama, "m/config.json");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("LlamaForCausalLM"), std::string::npos);
}

// V3.2's indexer fields are read and checked by name; they round-trip through config.json.
TEST(ModelFamily, V32ConfigNamesItsIndexerFields) {
  MakeModelOptions mo;
  mo.preset = "v32-tiny";
  auto c = make_model_config(mo);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_TRUE(c->indexer);
  EXPECT_EQ(c->indexer->n_heads, 16);
  EXPECT_EQ(c->indexer->topk, 16);
  auto back = parse_model_config(model_config_to_json(*c), "config.json");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->indexer->head_dim, 128);
  EXPECT_EQ(model_config_to_json(*back), model_config_to_json(*c));
  for (const char* set : {"index_head_dim=64", "index_topk=0", "q_lora_rank=null"}) {
    MakeModelOptions bad = mo;
    bad.overrides = {set};
    auto r = make_model_config(bad);
    const std::string field = std::string(set).substr(0, std::string(set).find('='));
    ASSERT_FALSE(r.ok()) << set;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
  }
}

TEST(LoadedModel, RefusesAnUnsupportedFamilyBeforeReadingWeights) {
  const std::string dir =
      (std::filesystem::path(::testing::TempDir()) / ("moeserve_v4_" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json")
      << R"({"model_type": "deepseek_v5", "architectures": ["DeepseekV5ForCausalLM"]})";
  ModelOptions o;
  o.model_dir = dir;
  auto m = LoadedModel::open(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("'deepseek_v5'"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("deepseek_v3"), std::string::npos);
  o.model_dir = dir + "/missing";
  auto n = LoadedModel::open(o);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("missing/config.json"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// What open() builds is what the pieces say: the family's layout, the fingerprint of
// model/fingerprint.h, the KV blocks asked for (or what kv_cache_gb holds), the options kept.
TEST(LoadedModel, OwnsTheModelItsCacheAndFingerprint) {
  const std::string dir = testing::small_model_dir("loaded", "tiny", {"num_hidden_layers=2"});
  ModelOptions o;
  o.model_dir = dir;
  o.threads = 1;
  o.kv_blocks = 7;
  o.mtp = true;
  auto m = LoadedModel::open(o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  LoadedModel& lm = **m;
  EXPECT_EQ(lm.family().name, "deepseek_v3");
  EXPECT_EQ(lm.cache().num_blocks(), 7);
  EXPECT_EQ(lm.cache().layout(), kv_cache_layout(lm.config(), DType::kBF16, /*mtp=*/true));
  EXPECT_EQ(lm.model().num_layers(), lm.cache().n_layers());
  EXPECT_TRUE(lm.model().has_mtp());
  auto fp = model_fingerprint(dir, DType::kBF16, ComputePath::kFast, /*mtp=*/true);
  ASSERT_TRUE(fp.ok());
  EXPECT_EQ(lm.fingerprint(), *fp);
  EXPECT_EQ(lm.cache().fingerprint(), *fp);
  EXPECT_EQ(lm.disk(), nullptr);
  EXPECT_EQ(lm.pool().size(), 1);

  // Sized by kv_cache_gb: whole blocks of the layout's bytes.
  o.kv_blocks.reset();
  o.mtp = false;
  const double block = double(kv_cache_layout(lm.config(), DType::kBF16).block_bytes());
  o.kv_cache_gb = 10.5 * block / 1e9;
  auto sized = LoadedModel::open(o);
  ASSERT_TRUE(sized.ok()) << sized.status().to_string();
  EXPECT_EQ((*sized)->cache().num_blocks(), 10);
  o.kv_cache_gb = 0.5 * block / 1e9;
  auto none = LoadedModel::open(o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("holds no KV block"), std::string::npos);
}

// The layout is checked at the boundary: the test models' kv_lora_rank (160) has no FP8 form.
TEST(LoadedModel, RefusesAKvFormatTheFamilyCannotStore) {
  ModelOptions o;
  o.model_dir = testing::small_model_dir("loaded", "tiny", {"num_hidden_layers=2"});
  o.threads = 1;
  o.kv_blocks = 1;
  o.kv_dtype = DType::kF8E4M3;
  auto m = LoadedModel::open(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("kv_lora_rank to be a multiple of 128"), std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find(o.model_dir), std::string::npos);
}

}  // namespace
}  // namespace moeserve
