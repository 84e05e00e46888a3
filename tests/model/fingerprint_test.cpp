// The model fingerprint (the KV hash chain's seed) tells apart everything that changes KV bits,
// and nothing else: the same checkpoint gives the same digest in every process.
#include "model/fingerprint.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "model/make_model.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

struct TinyModel {
  fs::path dir;
  explicit TinyModel(uint64_t seed, std::vector<std::string> overrides = {}) {
    dir = fs::temp_directory_path() /
          ("moeserve_fingerprint_" + std::to_string(::getpid()) + "_" + std::to_string(next++));
    MakeModelOptions o;
    o.seed = seed;
    o.overrides = {"vocab_size=512", "num_hidden_layers=2"};
    o.overrides.insert(o.overrides.end(), overrides.begin(), overrides.end());
    EXPECT_TRUE(make_model(o, dir.string(), nullptr).ok());
  }
  ~TinyModel() { fs::remove_all(dir); }
  uint64_t fingerprint(DType kv = DType::kBF16, ComputePath c = ComputePath::kFast) const {
    Result<uint64_t> f = model_fingerprint(dir.string(), kv, c);
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    return f.ok() ? *f : 0;
  }
  static inline int next = 0;
};

TEST(Fingerprint, SameCheckpointSameDigest) {
  TinyModel a(1), b(1);
  EXPECT_EQ(a.fingerprint(), a.fingerprint());
  EXPECT_EQ(a.fingerprint(), b.fingerprint());  // written twice, byte for byte
}

// Whatever changes a KV block's bits changes it, the cache's token format above all (an FP8
// block must never be found by a BF16 cache, nor the other way round).
TEST(Fingerprint, KvFormatAndComputePathChangeIt) {
  TinyModel a(1);
  std::set<uint64_t> seen;
  for (DType kv : {DType::kBF16, DType::kF8E4M3, DType::kF32}) {
    for (ComputePath path : {ComputePath::kFast, ComputePath::kReference}) {
      EXPECT_TRUE(seen.insert(a.fingerprint(kv, path)).second) << dtype_name(kv) << int(path);
    }
  }
  // Blocks that carry the MTP module's layer (docs/mtp.md) are other blocks.
  Result<uint64_t> mtp = model_fingerprint(a.dir.string(), DType::kBF16, ComputePath::kFast, true);
  ASSERT_TRUE(mtp.ok()) << mtp.status().to_string();
  EXPECT_TRUE(seen.insert(*mtp).second);
  // The projections' and the routed experts' formats change the latent's bits too; an expert
  // format equal to the projections' is no change.
  const WeightFormat formats[] = {WeightFormat::kFp8, WeightFormat::kInt8, WeightFormat::kInt4};
  for (WeightFormat p : formats) {
    for (WeightFormat e : formats) {
      Result<uint64_t> f =
          model_fingerprint(a.dir.string(), DType::kBF16, ComputePath::kFast, false, p, e);
      ASSERT_TRUE(f.ok()) << f.status().to_string();
      if (e == p) {
        EXPECT_EQ(*f,
                  *model_fingerprint(a.dir.string(), DType::kBF16, ComputePath::kFast, false, p))
            << weight_format_name(p);
      } else {
        EXPECT_TRUE(seen.insert(*f).second)
            << weight_format_name(p) << " " << weight_format_name(e);
      }
    }
  }
  for (WeightFormat p : {WeightFormat::kInt8, WeightFormat::kInt4}) {
    EXPECT_TRUE(
        seen.insert(*model_fingerprint(a.dir.string(), DType::kBF16, ComputePath::kFast, false, p))
            .second)
        << weight_format_name(p);
  }
}

// Another model with the same architecture (every header identical, as DeepSeek-V3, V3-0324 and
// R1 are) must not share KV: the weights' samples differ.
TEST(Fingerprint, OtherWeightsUnderIdenticalHeadersChangeIt) {
  TinyModel a(1), b(2);
  for (const auto& e : fs::directory_iterator(a.dir)) {
    if (e.path().extension() != ".json" && e.path().extension() != ".safetensors") continue;
    std::ifstream fa(e.path(), std::ios::binary), fb(b.dir / e.path().filename(), std::ios::binary);
    uint64_t la = 0, lb = 0;
    if (e.path().extension() == ".safetensors") {
      fa.read(reinterpret_cast<char*>(&la), 8);
      fb.read(reinterpret_cast<char*>(&lb), 8);
      ASSERT_EQ(la, lb);
      std::string ha(la, '\0'), hb(lb, '\0');
      fa.read(ha.data(), std::streamsize(la));
      fb.read(hb.data(), std::streamsize(lb));
      ASSERT_EQ(ha, hb) << e.path();  // the premise: identical headers
    }
  }
  EXPECT_NE(a.fingerprint(), b.fingerprint());
}

TEST(Fingerprint, ConfigChangesIt) {
  TinyModel a(1), b(1, {"rope_theta=20000"});
  EXPECT_NE(a.fingerprint(), b.fingerprint());
}

TEST(Fingerprint, AnUnreadableShardIsAnErrorNamingIt) {
  TinyModel a(1);
  fs::path shard;
  for (const auto& e : fs::directory_iterator(a.dir)) {
    if (e.path().extension() == ".safetensors") shard = e.path();
  }
  fs::resize_file(shard, 8);  // the header's length only
  Result<uint64_t> f = model_fingerprint(a.dir.string(), DType::kBF16, ComputePath::kFast);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(shard.filename().string()), std::string::npos)
      << f.status().message();
}

}  // namespace
}  // namespace moeserve
