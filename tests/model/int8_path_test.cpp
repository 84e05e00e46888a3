// The INT8 path (--gemm-int8) through the model's other ways in: an expert exported, dropped and
// installed again (EPLB's online migration, docs/eplb.md) is requantized for gemm_int8 like the
// ones packed at load, so the logits keep their bits; and the INT8 path changes them (it runs).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cache/kv_cache.h"
#include "core/thread_pool.h"
#include "ep/dispatcher.h"
#include "model/checkpoint.h"
#include "model/deepseek.h"

namespace moeserve {
namespace {

std::vector<float> logits_of(DeepseekModel& model, const std::vector<int32_t>& seq) {
  std::vector<int32_t> table;
  for (int32_t b = 0; b * kKvBlockSize < int64_t(seq.size()); ++b) table.push_back(b);
  KvCache cache(kv_cache_layout(model.config(), DType::kBF16), int32_t(table.size()));
  StepSequence step{seq, 0, table, int64_t(seq.size())};
  StepOutput out;
  EXPECT_TRUE(model.forward({&step, 1}, cache, &out).ok());
  return out.logits;
}

// Exports, drops and installs again every expert of the first MoE layer this process holds (what
// EPLB's migration does to a moved expert); how many, 0 if one failed.
int reinstall_held_experts(DeepseekModel& model, const ModelConfig& c) {
  int moved = 0;
  for (int32_t e = 0; e < int32_t(c.n_routed_experts); ++e) {
    if (!model.experts().has_expert(0, e)) continue;
    auto blob = model.experts().export_expert(0, e);
    EXPECT_TRUE(blob.ok()) << blob.status().to_string();
    if (!blob.ok()) return 0;
    std::vector<uint8_t> bytes(blob->size());
    blob->copy(0, bytes.size(), bytes.data());
    model.experts().drop_expert(0, e);
    const Status st = model.experts().install_expert(0, e, std::move(bytes));
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return 0;
    ++moved;
  }
  return moved;
}

TEST(Int8Path, ReinstalledExpertsKeepTheLogitsBits) {
  auto ck = Checkpoint::open("tests/data/hf/v3");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& c = (*ck)->config();
  ThreadPool pool(2);
  LocalDispatcher dispatcher(c.n_routed_experts);
  DeepseekModel model(c, (*ck)->weights(), dispatcher, &pool, AttentionMode::kAbsorbed,
                      ComputePath::kFast, /*overlap=*/true, /*progress=*/false,
                      GemmInt8Options{true, true, std::nullopt});
  DeepseekModel fp8(c, (*ck)->weights(), dispatcher, &pool, AttentionMode::kAbsorbed,
                    ComputePath::kFast);
  std::vector<int32_t> seq;
  for (int i = 0; i < 40; ++i) seq.push_back(int32_t((i * 37 + 5) % c.vocab_size));
  const std::vector<float> before = logits_of(model, seq);
  const std::vector<float> other = logits_of(fp8, seq);
  ASSERT_EQ(before.size(), other.size());
  EXPECT_NE(std::memcmp(before.data(), other.data(), before.size() * 4), 0)
      << "--gemm-int8 gave the FP8 path's bits: it did not run";
  ASSERT_GT(reinstall_held_experts(model, c), 0);
  const std::vector<float> after = logits_of(model, seq);
  ASSERT_EQ(after.size(), before.size());
  EXPECT_EQ(std::memcmp(after.data(), before.data(), before.size() * 4), 0);
}

// --expert-dtype int4 / int8: the routed experts are requantized (the logits move from the FP8
// path's, by a bounded amount on this random model; tiny-py's figures are in
// docs/quantization.md), and experts reinstalled by migration are requantized the same way.
TEST(ExpertDtype, RequantizedExpertsRunAndReinstalledOnesKeepTheBits) {
  auto ck = Checkpoint::open("tests/data/hf/v3");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& c = (*ck)->config();
  ThreadPool pool(2);
  LocalDispatcher dispatcher(c.n_routed_experts);
  std::vector<int32_t> seq;
  for (int i = 0; i < 40; ++i) seq.push_back(int32_t((i * 37 + 5) % c.vocab_size));
  DeepseekModel fp8(c, (*ck)->weights(), dispatcher, &pool, AttentionMode::kAbsorbed,
                    ComputePath::kFast);
  const std::vector<float> ref = logits_of(fp8, seq);
  for (WeightFormat f : {WeightFormat::kInt8, WeightFormat::kInt4}) {
    SCOPED_TRACE(weight_format_name(f));
    GemmInt8Options o;
    o.experts = f;
    DeepseekModel model(c, (*ck)->weights(), dispatcher, &pool, AttentionMode::kAbsorbed,
                        ComputePath::kFast, /*overlap=*/true, /*progress=*/false, o);
    const std::vector<float> before = logits_of(model, seq);
    ASSERT_EQ(before.size(), ref.size());
    EXPECT_NE(std::memcmp(before.data(), ref.data(), ref.size() * 4), 0) << "it did not run";
    float max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(before[i] - ref[i]));
      max_abs = std::max(max_abs, std::abs(ref[i]));
    }
    EXPECT_LT(max_diff, (f == WeightFormat::kInt4 ? 0.25f : 0.05f) * max_abs);
    ASSERT_GT(reinstall_held_experts(model, c), 0);
    const std::vector<float> after = logits_of(model, seq);
    EXPECT_EQ(std::memcmp(after.data(), before.data(), before.size() * 4), 0);
  }
}

}  // namespace
}  // namespace moeserve
