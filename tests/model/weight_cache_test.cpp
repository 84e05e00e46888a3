// The prepared weights on disk (model/weight_cache.h): the first start writes them, a later
// start maps them (the checkpoint's projections are not read again) and computes the same bits;
// the INT8 options and the INT4 experts get their own files; a damaged or truncated file is
// reported, prepared again from the checkpoint and rewritten, never used.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "core/thread_pool.h"
#include "ep/dispatcher.h"
#include "model/checkpoint.h"
#include "model/deepseek.h"
#include "model/weight_cache.h"
#include "test_models.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> cache_files(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

class WeightCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = testing::small_model_dir("weight_cache", "tiny");
    cache_dir_ = (fs::path(::testing::TempDir()) /
                  ("moeserve_wcache_" + std::to_string(::getpid()) + "_" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                     .string();
    fs::remove_all(cache_dir_);
    fs::create_directories(cache_dir_);
    auto ck = Checkpoint::open(model_dir_);
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    ck_ = std::move(*ck);
  }
  void TearDown() override { fs::remove_all(cache_dir_); }

  std::vector<float> logits(WeightFormats int8, const WeightCacheOptions& cache) {
    const ModelConfig& c = ck_->config();
    LocalDispatcher dispatcher(c.n_routed_experts, /*bf16_rows=*/true);
    DeepseekModel model(c, ck_->weights(), dispatcher, &pool_, AttentionMode::kAbsorbed,
                        ComputePath::kFast, /*overlap=*/true, /*progress=*/false, int8, cache);
    std::vector<int32_t> seq;
    for (int i = 0; i < 30; ++i) seq.push_back(int32_t((i * 53 + 11) % c.vocab_size));
    std::vector<int32_t> table;
    for (int32_t b = 0; b * kKvBlockSize < int64_t(seq.size()); ++b) table.push_back(b);
    KvCache kv(kv_cache_layout(c, DType::kBF16), int32_t(table.size()));
    StepSequence step{seq, 0, table, int64_t(seq.size())};
    StepOutput out;
    EXPECT_TRUE(model.forward({&step, 1}, kv, &out).ok());
    EXPECT_FALSE(out.logits.empty());
    return out.logits;
  }

  static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  }

  std::string model_dir_, cache_dir_;
  std::unique_ptr<Checkpoint> ck_;
  ThreadPool pool_{2};
};

TEST_F(WeightCacheTest, TheSecondStartMapsTheFirstStartsWeightsAndGetsTheSameBits) {
  const std::vector<float> plain = logits({}, {});
  EXPECT_TRUE(cache_files(cache_dir_).empty());
  const WeightCacheOptions cache{cache_dir_, 0x1234};
  const std::vector<float> first = logits({}, cache);
  const auto files = cache_files(cache_dir_);
  ASSERT_EQ(files.size(), 1u) << "the first start writes one file";
  const auto written = fs::last_write_time(files[0]);
  const std::vector<float> second = logits({}, cache);
  EXPECT_EQ(cache_files(cache_dir_), files);
  EXPECT_EQ(fs::last_write_time(files[0]), written) << "the second start rewrote the file";
  EXPECT_TRUE(same_bits(first, plain));
  EXPECT_TRUE(same_bits(second, plain));
  // Another model key, or INT8 options: other files, their own bits.
  logits({}, {cache_dir_, 0x5678});
  const std::vector<float> int8_plain =
      logits({WeightFormat::kInt8, HeadFormat::kInt8, std::nullopt}, {});
  const std::vector<float> int8_first =
      logits({WeightFormat::kInt8, HeadFormat::kInt8, std::nullopt}, cache);
  const std::vector<float> int8_second =
      logits({WeightFormat::kInt8, HeadFormat::kInt8, std::nullopt}, cache);
  const WeightFormats int4{WeightFormat::kInt4, HeadFormat::kInt4, std::nullopt};
  const std::vector<float> int4_plain = logits(int4, {});
  const std::vector<float> int4_first = logits(int4, cache);
  const std::vector<float> int4_second = logits(int4, cache);
  EXPECT_EQ(cache_files(cache_dir_).size(), 4u);
  EXPECT_FALSE(same_bits(int8_plain, plain));
  EXPECT_TRUE(same_bits(int8_first, int8_plain));
  EXPECT_TRUE(same_bits(int8_second, int8_plain));
  EXPECT_FALSE(same_bits(int4_plain, plain));
  EXPECT_TRUE(same_bits(int4_first, int4_plain));
  EXPECT_TRUE(same_bits(int4_second, int4_plain));
}

TEST_F(WeightCacheTest, ADamagedOrTruncatedFileIsPreparedAgainAndRewritten) {
  const std::vector<float> plain = logits({}, {});
  const WeightCacheOptions cache{cache_dir_, 7};
  logits({}, cache);
  const std::string file = cache_files(cache_dir_).at(0);
  const uintmax_t size = fs::file_size(file);
  for (const char* damage : {"flip", "truncate"}) {
    if (std::string(damage) == "flip") {
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(size - 100));
      const char x = char(0x5a);
      f.write(&x, 1);
    } else {
      fs::resize_file(file, size / 2);
    }
    ::testing::internal::CaptureStderr();
    const std::vector<float> again = logits({}, cache);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find(file), std::string::npos) << damage << ": " << err;
    EXPECT_TRUE(same_bits(again, plain)) << damage;
    EXPECT_EQ(fs::file_size(file), size) << damage << ": not rewritten whole";
    ::testing::internal::CaptureStderr();
    EXPECT_TRUE(same_bits(logits({}, cache), plain)) << damage;
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << damage << ": rewritten badly";
  }
}

TEST(WeightCacheFile, ItemsOfAnotherKindOrKeyAreRefused) {
  const std::string dir = ::testing::TempDir();
  const std::string path = weight_cache_path(dir, 42);
  std::vector<uint8_t> w(256 * 200, 0x38);
  std::vector<float> s(2 * 2, 0.5f);
  PackedFp8Weight fp8 = pack_fp8_weight(w.data(), s.data(), 256, 200);
  std::vector<int32_t> rows = {3, 1, 4};
  {
    std::vector<CachedWeight> items = {{&fp8}, {nullptr, nullptr, nullptr, &rows}};
    ASSERT_TRUE(save_weight_cache(path, 42, items).ok());
  }
  PackedFp8Weight got;
  std::vector<int32_t> got_rows;
  std::vector<CachedWeight> items = {{&got}, {nullptr, nullptr, nullptr, &got_rows}};
  ASSERT_TRUE(load_weight_cache(path, 42, items).ok());
  EXPECT_EQ(got.n, 256);
  EXPECT_EQ(got.k, 200);
  EXPECT_EQ(std::memcmp(got.data.get(), fp8.data.get(), fp8.bytes()), 0);
  EXPECT_EQ(got.scale_inv, fp8.scale_inv);
  EXPECT_EQ(got_rows, rows);
  EXPECT_EQ(load_weight_cache(path, 43, items).code(), StatusCode::kCorrupt);
  PackedBf16Weight bf16;
  std::vector<CachedWeight> wrong = {{nullptr, nullptr, &bf16}, {nullptr, nullptr, nullptr, &rows}};
  const Status s2 = load_weight_cache(path, 42, wrong);
  EXPECT_EQ(s2.code(), StatusCode::kCorrupt);
  EXPECT_NE(s2.message().find(path), std::string::npos) << s2.message();
  std::vector<CachedWeight> fewer = {{&got}};
  EXPECT_EQ(load_weight_cache(path, 42, fewer).code(), StatusCode::kCorrupt);
  EXPECT_EQ(load_weight_cache(weight_cache_path(dir, 44), 44, items).code(), StatusCode::kNotFound);
  fs::remove(path);
}

}  // namespace
}  // namespace moeserve
