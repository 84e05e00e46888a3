// Loading checkpoints, and every kind of bad checkpoint giving an error that names the file and
// the tensor or field (run under AddressSanitizer too: cmake -DMOESERVE_ASAN=ON).
#include "model/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "test_models.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  // A fresh copy of the small model that a test may damage.
  std::string damaged_copy(const std::string& name) {
    static const std::string clean = testing::small_model_dir("ckpt", "tiny");
    std::string dir = clean + "_" + name;
    fs::remove_all(dir);
    fs::copy(clean, dir);
    return dir;
  }
  static std::string shard(const std::string& dir, int i) {
    return dir + "/model-0000" + std::to_string(i) + "-of-00002.safetensors";
  }
  static std::string error_of(const std::string& dir) {
    auto ck = Checkpoint::open(dir);
    EXPECT_FALSE(ck.ok());
    return ck.ok() ? "" : ck.status().message();
  }
  // Rewrites one shard through f(name, info, writer) deciding what to keep.
  template <typename F>
  static void rewrite(const std::string& path, F f) {
    SafetensorsWriter w;
    {
      auto file = SafetensorsFile::open(path);
      ASSERT_TRUE(file.ok()) << file.status().to_string();
      for (const auto& [name, info] : file->tensors()) f(name, info, w);
    }
    ASSERT_TRUE(w.write(path).ok());
  }
};

TEST_F(CheckpointTest, LoadsEveryWeightWithConfigShapes) {
  std::string dir = testing::small_model_dir("ckpt", "tiny");
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& c = (*ck)->config();
  const ModelWeights& w = (*ck)->weights();
  EXPECT_EQ(c.hidden_size, 200);
  ASSERT_EQ(int64_t(w.layers.size()), c.num_hidden_layers);
  EXPECT_TRUE(w.layers[0].mlp);
  EXPECT_FALSE(w.layers[0].moe);
  ASSERT_TRUE(w.layers[1].moe);
  const MoeWeights& m = *w.layers[1].moe;
  EXPECT_EQ(int64_t(m.experts.size()), c.n_routed_experts);
  EXPECT_EQ(int64_t(m.score_bias.size()), c.n_routed_experts);
  EXPECT_TRUE(m.shared);
  const WeightView& qa = *w.layers[1].attn.q_a;
  EXPECT_EQ(qa.dtype, DType::kF8E4M3);
  EXPECT_EQ(qa.rows, 96);
  EXPECT_EQ(qa.cols, 200);
  EXPECT_EQ(qa.scale_cols(), 2);  // 200 = one full and one partial 128-block
  EXPECT_EQ(w.embed.dtype, DType::kBF16);
  EXPECT_GT((*ck)->weight_bytes(), 0u);
}

TEST_F(CheckpointTest, ExpertFilterMapsOnlyHeldExperts) {
  std::string dir = testing::small_model_dir("ckpt", "tiny");
  LoadOptions o;
  o.holds_expert = [](int32_t e) { return e % 4 == 1; };
  auto ck = Checkpoint::open(dir, o);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const MoeWeights& m = *(*ck)->weights().layers[2].moe;
  for (size_t e = 0; e < m.experts.size(); ++e) EXPECT_EQ(m.experts[e].has_value(), e % 4 == 1);
  auto all = Checkpoint::open(dir);
  EXPECT_LT((*ck)->weight_bytes(), (*all)->weight_bytes());
}

TEST_F(CheckpointTest, TruncatedShard) {
  std::string dir = damaged_copy("truncated");
  fs::resize_file(shard(dir, 2), fs::file_size(shard(dir, 2)) - 1000);
  std::string e = error_of(dir);
  EXPECT_NE(e.find("model-00002-of-00002.safetensors"), std::string::npos) << e;
}

TEST_F(CheckpointTest, HeaderOffsetPastEndOfFile) {
  std::string dir = damaged_copy("offset");
  // Patch the last data_offsets end in the JSON header to a huge number of the same width.
  std::fstream f(shard(dir, 1), std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  auto j = nlohmann::json::parse(header);
  std::string victim;
  uint64_t end = 0;
  for (auto& [name, v] : j.items()) {
    if (name != "__metadata__" && v["data_offsets"][1].get<uint64_t>() >= end) {
      end = v["data_offsets"][1].get<uint64_t>();
      victim = name;
    }
  }
  // fmt rather than string concatenation: GCC 12 warns falsely (-Wrestrict) on the latter.
  std::string from = fmt::format(",{}]", end);
  std::string to = fmt::format(",{}]", std::string(from.size() - 2, '9'));
  size_t at = header.find(from);
  ASSERT_NE(at, std::string::npos);
  header.replace(at, from.size(), to);
  f.seekp(8);
  f.write(header.data(), std::streamsize(header.size()));
  f.close();
  std::string e = error_of(dir);
  EXPECT_NE(e.find("model-00001-of-00002.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find(victim), std::string::npos) << e;
}

TEST_F(CheckpointTest, ShapeMismatchNamesTensor) {
  std::string dir = damaged_copy("shape");
  rewrite(shard(dir, 1), [](const std::string& name, const TensorInfo& t, SafetensorsWriter& w) {
    if (name == "model.layers.0.input_layernorm.weight") {
      std::vector<uint16_t> v(199, 0x3f80);
      w.add(name, DType::kBF16, {199}, v.data(), v.size() * 2);
    } else {
      w.add(name, t.dtype, t.shape, t.data, t.nbytes);
    }
  });
  std::string e = error_of(dir);
  EXPECT_NE(e.find("model.layers.0.input_layernorm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[199]"), std::string::npos) << e;
  EXPECT_NE(e.find("model-00001-of-00002.safetensors"), std::string::npos) << e;
}

TEST_F(CheckpointTest, DtypeMismatchNamesTensor) {
  std::string dir = damaged_copy("dtype");
  rewrite(shard(dir, 2), [](const std::string& name, const TensorInfo& t, SafetensorsWriter& w) {
    if (name == "model.norm.weight") {
      std::vector<int32_t> v(size_t(t.numel()), 1);
      w.add(name, DType::kI32, t.shape, v.data(), v.size() * 4);
    } else {
      w.add(name, t.dtype, t.shape, t.data, t.nbytes);
    }
  });
  std::string e = error_of(dir);
  EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("I32"), std::string::npos) << e;
}

TEST_F(CheckpointTest, MissingTensorAndScale) {
  for (std::string victim : {"model.layers.1.self_attn.o_proj.weight_scale_inv",
                             "model.layers.2.mlp.experts.3.up_proj.weight"}) {
    std::string dir = damaged_copy("missing");
    for (int s : {1, 2}) {
      rewrite(shard(dir, s),
              [&](const std::string& name, const TensorInfo& t, SafetensorsWriter& w) {
                if (name != victim) w.add(name, t.dtype, t.shape, t.data, t.nbytes);
              });
    }
    std::string e = error_of(dir);
    EXPECT_NE(e.find(victim), std::string::npos) << e;
  }
}

TEST_F(CheckpointTest, UnexpectedTensorIsReported) {
  std::string dir = damaged_copy("unexpected");
  rewrite(shard(dir, 1), [](const std::string& name, const TensorInfo& t, SafetensorsWriter& w) {
    w.add(name, t.dtype, t.shape, t.data, t.nbytes);
    if (name == "model.embed_tokens.weight") {
      float x = 1.0f;
      w.add("model.layers.0.mystery.weight", DType::kF32, {1}, &x, 4);
    }
  });
  std::string e = error_of(dir);
  EXPECT_NE(e.find("model.layers.0.mystery.weight"), std::string::npos) << e;
}

TEST_F(CheckpointTest, MtpModuleLoadsOnlyWhenAsked) {
  // The tiny preset has one MTP module (model.layers.4.*, without the shared copies).
  std::string dir = damaged_copy("mtp");
  auto plain = Checkpoint::open(dir);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ((*plain)->weights().layers.size(), 4u);
  EXPECT_FALSE((*plain)->weights().mtp.has_value());
  LoadOptions with_mtp;
  with_mtp.mtp = true;
  auto ck = Checkpoint::open(dir, with_mtp);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelWeights& w = (*ck)->weights();
  ASSERT_EQ(w.layers.size(), 5u);
  ASSERT_TRUE(w.mtp.has_value());
  EXPECT_EQ(w.mtp->eh_proj.rows, 200);
  EXPECT_EQ(w.mtp->eh_proj.cols, 400);
  EXPECT_TRUE(w.layers[4].moe.has_value());  // past first_k_dense_replace: an MoE layer
  EXPECT_GT((*ck)->weight_bytes(), (*plain)->weight_bytes());

  // Without num_nextn_predict_layers the layer is unexpected, and --speculative mtp says why.
  std::string config_path = dir + "/config.json";
  auto j = nlohmann::json::parse(std::ifstream(config_path));
  j["num_nextn_predict_layers"] = 0;
  std::ofstream(config_path) << j.dump();
  std::string e = error_of(dir);
  EXPECT_NE(e.find("model.layers.4.eh_proj.weight"), std::string::npos) << e;
  auto refused = Checkpoint::open(dir, with_mtp);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("num_nextn_predict_layers"), std::string::npos)
      << refused.status().to_string();

  // A module missing a tensor: named when asked for, no obstacle otherwise.
  j["num_nextn_predict_layers"] = 1;
  std::ofstream(config_path) << j.dump();
  rewrite(shard(dir, 2), [](const std::string& name, const TensorInfo& t, SafetensorsWriter& w) {
    if (name != "model.layers.4.hnorm.weight") w.add(name, t.dtype, t.shape, t.data, t.nbytes);
  });
  auto index = nlohmann::json::parse(std::ifstream(dir + "/model.safetensors.index.json"));
  index["weight_map"].erase("model.layers.4.hnorm.weight");
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
  EXPECT_TRUE(Checkpoint::open(dir).ok());
  auto missing = Checkpoint::open(dir, with_mtp);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("model.layers.4.hnorm.weight"), std::string::npos)
      << missing.status().to_string();
}

TEST_F(CheckpointTest, BadConfigField) {
  std::string dir = damaged_copy("config");
  std::string config_path = dir + "/config.json";
  auto j = nlohmann::json::parse(std::ifstream(config_path));
  j["kv_lora_rank"] = "wide";
  std::ofstream(config_path) << j.dump();
  std::string e = error_of(dir);
  EXPECT_NE(e.find("kv_lora_rank"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
}

TEST_F(CheckpointTest, ConfigDisagreeingWithWeights) {
  std::string dir = damaged_copy("disagree");
  std::string config_path = dir + "/config.json";
  auto j = nlohmann::json::parse(std::ifstream(config_path));
  j["q_lora_rank"] = 64;
  std::ofstream(config_path) << j.dump();
  std::string e = error_of(dir);
  EXPECT_NE(e.find("q_a_proj.weight"), std::string::npos) << e;
}

TEST_F(CheckpointTest, MissingFiles) {
  std::string dir = damaged_copy("nofile");
  fs::remove(shard(dir, 2));
  std::string e = error_of(dir);
  EXPECT_NE(e.find("model-00002-of-00002.safetensors"), std::string::npos) << e;

  dir = damaged_copy("noconfig");
  fs::remove(dir + "/config.json");
  e = error_of(dir);
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;

  e = error_of("/nonexistent/model");
  EXPECT_NE(e.find("/nonexistent/model"), std::string::npos) << e;
}

TEST_F(CheckpointTest, IndexNamingATensorNotInItsShard) {
  std::string dir = damaged_copy("index");
  std::string index_path = dir + "/model.safetensors.index.json";
  auto j = nlohmann::json::parse(std::ifstream(index_path));
  j["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  std::ofstream(index_path) << j.dump();
  std::string e = error_of(dir);
  EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
}

}  // namespace
}  // namespace moeserve
