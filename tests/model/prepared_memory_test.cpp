// The fast path's prepared weights do not keep the checkpoint's pages resident beside them
// (core/file_pages.h): once a projection is repacked, the mapped pages it came from leave the
// process's resident set; what reads them later (the reference path) gets the same bytes back.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "cache/kv_cache.h"
#include "core/thread_pool.h"
#include "ep/dispatcher.h"
#include "model/checkpoint.h"
#include "model/deepseek.h"
#include "test_models.h"

namespace moeserve {
namespace {

// Resident kB of every mapping of a file under `dir` (/proc/self/smaps).
int64_t resident_kb_under(const std::string& dir) {
  std::ifstream in("/proc/self/smaps");
  int64_t kb = 0;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    const size_t dash = line.find('-'), space = line.find(' ');
    const bool header = dash != std::string::npos && space != std::string::npos && dash < space &&
                        line.find_first_not_of("0123456789abcdef-") == space;
    if (header) {
      inside = line.find(dir) != std::string::npos;
    } else if (line.rfind("Rss:", 0) == 0 && inside) {
      kb += std::stoll(line.substr(4));
    }
  }
  return kb;
}

// Reads every byte of every tensor of a weight view (so its pages are resident).
uint64_t touch(const WeightView& w) {
  uint64_t s = 0;
  for (size_t i = 0; i < w.bytes(); i += 512) s += w.data[i];
  return s;
}

TEST(PreparedMemory, RepackedProjectionsLeaveTheResidentSet) {
  const std::string dir =
      std::filesystem::canonical(
          testing::small_model_dir("prepared_memory", "tiny", {"hidden_size=512"}))
          .string();
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& c = (*ck)->config();
  const ModelWeights& w = (*ck)->weights();
  // Every FP8 projection, each counted by the whole pages inside it.
  const int64_t page = sysconf(_SC_PAGESIZE);
  int64_t releasable = 0;
  uint64_t sink = 0;
  auto count = [&](const WeightView& v) {
    if (v.dtype != DType::kF8E4M3) return;
    sink += touch(v);
    releasable += std::max<int64_t>(0, int64_t(v.bytes()) - 2 * page);
  };
  for (const LayerWeights& L : w.layers) {
    for (const WeightView* v : {&L.attn.q_b, &L.attn.kv_a, &L.attn.o}) count(*v);
    if (L.attn.q_a) count(*L.attn.q_a);
    auto mlp = [&](const MlpWeights& m) {
      for (const WeightView* v : {&m.gate, &m.up, &m.down}) count(*v);
    };
    if (L.mlp) mlp(*L.mlp);
    if (L.moe) {
      for (const auto& e : L.moe->experts) {
        if (e) mlp(*e);
      }
      if (L.moe->shared) mlp(*L.moe->shared);
    }
  }
  ASSERT_GT(releasable, 4 << 20) << "the test model is too small to tell";
  ThreadPool pool(2);
  LocalDispatcher dispatcher(c.n_routed_experts);
  std::vector<int32_t> seq;
  for (int i = 0; i < 24; ++i) seq.push_back(int32_t((i * 37 + 5) % c.vocab_size));
  std::vector<int32_t> table;
  for (int32_t b = 0; b * kKvBlockSize < int64_t(seq.size()); ++b) table.push_back(b);
  auto logits = [&](DeepseekModel& m) {
    KvCache cache(kv_cache_layout(c, DType::kBF16), int32_t(table.size()));
    StepSequence step{seq, 0, table, int64_t(seq.size())};
    StepOutput out;
    EXPECT_TRUE(m.forward({&step, 1}, cache, &out).ok());
    return out.logits;
  };
  // The reference path reads the checkpoint's own bytes.
  DeepseekModel ref(c, w, dispatcher, &pool, AttentionMode::kAbsorbed, ComputePath::kReference);
  const std::vector<float> ref_before = logits(ref);
  const int64_t before = resident_kb_under(dir);
  DeepseekModel model(c, w, dispatcher, &pool, AttentionMode::kAbsorbed, ComputePath::kFast);
  const int64_t after = resident_kb_under(dir);
  std::printf(
      "[ checkpoint resident: %.1f MB touched, %.1f MB after preparing (%.1f MB of "
      "projections) ]\n",
      before / 1024.0, after / 1024.0, releasable / 1048576.0);
  EXPECT_LE(after, before - releasable / 1024 * 95 / 100);
  // Read again, the released pages fault back in from the file: the same bytes, the same bits.
  const std::vector<float> ref_after = logits(ref);
  ASSERT_FALSE(ref_before.empty());
  ASSERT_EQ(ref_after.size(), ref_before.size());
  EXPECT_EQ(std::memcmp(ref_after.data(), ref_before.data(), ref_before.size() * 4), 0) << sink;
  EXPECT_GE(resident_kb_under(dir), after + releasable / 1024 * 95 / 100);
  EXPECT_FALSE(logits(model).empty());
}

}  // namespace
}  // namespace moeserve
