// DiskTier against real files: blocks written by one cache are found by another (a restart),
// and every kind of bad object is a counted miss that removes the file, never wrong KV.
#include "cache/disk_tier.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include "tier_test_util.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kFingerprint = 0xfeedf00d;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("moeserve_disk_tier_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static inline int counter = 0;
};

KvLayout layout() {
  return {/*n_layers=*/2, {DType::kF32, /*kv_lora_rank=*/2, /*rope_dim=*/1}};
}

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = i * 5 + salt;
  return t;
}

std::unique_ptr<DiskTier> open_tier(const fs::path& dir, uint64_t fingerprint = kFingerprint,
                                    double gb = 0) {
  DiskTierOptions o;
  o.dir = dir.string();
  o.capacity_gb = gb;
  auto t = DiskTier::open(o, fingerprint, layout().block_bytes());
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(*t);
}

// Computes (writes) and registers the full blocks of `t` in a fresh table of `c`; every value
// is a function of (layer, position, salt) so a wrong block shows.
std::vector<int32_t> compute_blocks(KvCache& c, const std::vector<int32_t>& t, int salt) {
  std::vector<int32_t> table;
  EXPECT_TRUE(c.allocate(blocks_for(int64_t(t.size())), &table));
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t p = 0; p < int64_t(t.size()); ++p) {
      float v[3] = {float(l), float(p), float(salt * 1000 + p)};
      c.write(l, table, p, v);
    }
  }
  uint64_t parent = c.fingerprint();
  for (int64_t b = 0; (b + 1) * kKvBlockSize <= int64_t(t.size()); ++b) {
    auto bt = std::span<const int32_t>(t).subspan(size_t(b * kKvBlockSize), kKvBlockSize);
    uint64_t h = c.chain_hash(parent, bt);
    c.register_block(table[size_t(b)], h, parent, bt);
    parent = h;
  }
  return table;
}

// Blocks of t found by a fresh cache over the tier (a restarted process).
int32_t hits_after_restart(DiskTier& tier, const std::vector<int32_t>& t, float* probe = nullptr) {
  KvCache c(layout(), 8, kFingerprint);
  c.set_tier(&tier);
  std::vector<int32_t> table;
  std::vector<uint64_t> hashes;
  int32_t n = acquire_with_tier(c, t, 8, &table, &hashes);
  if (probe && n > 0) c.read(1, table, 70 % (n * kKvBlockSize), probe);
  c.release(table);
  return n;
}

TEST(DiskTier, BlocksOutliveTheCache) {
  TempDir dir;
  auto t = tokens(150, 1);  // two full blocks
  {
    auto tier = open_tier(dir.path);
    KvCache c(layout(), 8, kFingerprint);
    c.set_tier(tier.get());
    compute_blocks(c, t, 3);
    tier->flush();
    EXPECT_EQ(tier->stats().written, 2);
  }
  auto tier = open_tier(dir.path);
  float v[3] = {0, 0, 0};
  EXPECT_EQ(hits_after_restart(*tier, t, v), 2);
  EXPECT_EQ(v[2], 3000.0f + 70);
  EXPECT_EQ(tier->stats().hits, 2);
  // A prompt that leaves the chain after block 0 gets block 0 only; the miss is counted.
  auto u = t;
  u[100] += 1;
  EXPECT_EQ(hits_after_restart(*tier, u), 1);
  EXPECT_EQ(tier->stats().misses, 1);
}

// An FP8 cache's blocks (FlashMLA's format: 2 layers x 64 tokens x (128 + 4 + 2) bytes here)
// travel through the tier byte for byte: the tier only knows the layout's block_bytes().
TEST(DiskTier, Fp8BlocksRoundTrip) {
  TempDir dir;
  const KvLayout fp8{/*n_layers=*/2, {DType::kF8E4M3, /*kv_lora_rank=*/128, /*rope_dim=*/1}};
  DiskTierOptions o;
  o.dir = dir.path.string();
  auto tier = DiskTier::open(o, kFingerprint, fp8.block_bytes());
  ASSERT_TRUE(tier.ok()) << tier.status().to_string();
  const auto t = tokens(64, 2);
  KvBlock written;
  {
    KvCache c(fp8, 4, kFingerprint);
    c.set_tier(tier->get());
    std::vector<int32_t> table;
    ASSERT_TRUE(c.allocate(1, &table));
    std::vector<float> v(129);
    for (int64_t l = 0; l < 2; ++l) {
      for (int64_t p = 0; p < 64; ++p) {
        for (size_t i = 0; i < v.size(); ++i) v[i] = float(l * 1000 + p) * 0.01f + float(i);
        c.write(l, table, p, v.data());
      }
    }
    c.register_block(table[0], c.chain_hash(kFingerprint, t), kFingerprint, t);
    written = c.export_block(table[0]);
    (*tier)->flush();
    EXPECT_EQ((*tier)->stats().written, 1);
  }
  KvCache c(fp8, 4, kFingerprint);
  c.set_tier(tier->get());
  std::vector<int32_t> table;
  std::vector<uint64_t> hashes;
  ASSERT_EQ(acquire_with_tier(c, t, 1, &table, &hashes), 1);
  EXPECT_EQ(c.export_block(table[0]).bytes, written.bytes);
  c.release(table);
}

// Each bad object: a miss, the file removed, the reason counted.
TEST(DiskTier, EveryCorruptionIsACountedMiss) {
  struct Case {
    const char* name;
    DiskReject why;
    std::function<void(const fs::path& obj, const fs::path& other)> spoil;
  };
  auto patch = [](const fs::path& p, std::streamoff at, uint8_t x) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = char(uint8_t(c) ^ x);
    f.seekp(at);
    f.write(&c, 1);
  };
  std::vector<Case> cases = {
      {"flipped payload byte", DiskReject::kChecksum,
       [&](const fs::path& p, const fs::path&) {
         patch(p, std::streamoff(fs::file_size(p) - 5), 1);
       }},
      {"truncated", DiskReject::kShort,
       [](const fs::path& p, const fs::path&) { fs::resize_file(p, fs::file_size(p) - 100); }},
      {"zero-length", DiskReject::kShort,
       [](const fs::path& p, const fs::path&) { fs::resize_file(p, 0); }},
      {"not an object", DiskReject::kMagic,
       [&](const fs::path& p, const fs::path&) { patch(p, 0, 0xff); }},
      {"old format version", DiskReject::kVersion,
       [&](const fs::path& p, const fs::path&) { patch(p, 4, 0x03); }},
      {"another model's header", DiskReject::kFingerprint,
       [&](const fs::path& p, const fs::path&) { patch(p, 8, 0x10); }},
      {"another block's object under this name", DiskReject::kIdentity,
       [](const fs::path& p, const fs::path& other) {
         fs::copy_file(other, p, fs::copy_options::overwrite_existing);
       }},
      {"a flipped token", DiskReject::kIdentity,
       [&](const fs::path& p, const fs::path&) { patch(p, 56 + 8, 0x01); }},
      {"trailing bytes", DiskReject::kSize,
       [](const fs::path& p, const fs::path&) {
         std::ofstream(p, std::ios::app | std::ios::binary) << "x";
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    auto t = tokens(64, 7), other = tokens(64, 8);
    auto tier = open_tier(dir.path);
    {
      KvCache cache(layout(), 8, kFingerprint);
      cache.set_tier(tier.get());
      compute_blocks(cache, t, 1);
      compute_blocks(cache, other, 2);
      tier->flush();
    }
    const uint64_t h = KvCache(layout(), 1, kFingerprint).chain_hash(kFingerprint, t);
    const uint64_t h_other = KvCache(layout(), 1, kFingerprint).chain_hash(kFingerprint, other);
    const fs::path obj = tier->object_path(h);
    ASSERT_TRUE(fs::exists(obj));
    c.spoil(obj, tier->object_path(h_other));
    EXPECT_EQ(hits_after_restart(*tier, t), 0);
    EXPECT_EQ(tier->stats().rejected[size_t(c.why)], 1) << to_string(c.why);
    EXPECT_FALSE(fs::exists(obj));
    EXPECT_EQ(hits_after_restart(*tier, other), 1);  // the other object is untouched
  }
}

TEST(DiskTier, AnotherFingerprintNeverMatches) {
  TempDir dir;
  auto t = tokens(64, 2);
  {
    auto tier = open_tier(dir.path);
    KvCache c(layout(), 4, kFingerprint);
    c.set_tier(tier.get());
    compute_blocks(c, t, 1);
    tier->flush();
  }
  // Another model's cache computes other chain hashes: a plain miss, nothing removed.
  auto tier = open_tier(dir.path, kFingerprint + 1);
  KvCache c(layout(), 4, kFingerprint + 1);
  c.set_tier(tier.get());
  std::vector<int32_t> table;
  std::vector<uint64_t> h;
  EXPECT_EQ(acquire_with_tier(c, t, 4, &table, &h), 0);
  EXPECT_EQ(tier->stats().misses, 1);
}

TEST(DiskTier, SizeBudgetHoldsUnderChurn) {
  TempDir dir;
  const double block_file = double(layout().block_bytes() + 56 + 64 * 4);
  const double budget_gb = 10 * block_file / 1e9;  // ten objects
  auto tier = open_tier(dir.path, kFingerprint, budget_gb);
  KvCache c(layout(), 4, kFingerprint);
  c.set_tier(tier.get());
  for (int i = 0; i < 60; ++i) {
    std::vector<int32_t> table = compute_blocks(c, tokens(64, 100 + i), i);
    c.release(table);
    tier->flush();
  }
  int64_t bytes = 0;
  for (auto& e : fs::recursive_directory_iterator(dir.path)) {
    if (e.is_regular_file()) bytes += int64_t(e.file_size());
  }
  EXPECT_LE(double(bytes), budget_gb * 1e9);
  EXPECT_GT(tier->stats().evicted, 40);
  // The most recent objects are the ones kept.
  EXPECT_EQ(hits_after_restart(*tier, tokens(64, 159)), 1);
}

// A writer killed between writing its temporary file and renaming it leaves the file behind:
// the budget's scan counts it and removes it once it is old; a recent one (a live write) stays.
TEST(DiskTier, TheBudgetRemovesADeadWritersTemporaryFiles) {
  TempDir dir;
  const double block_file = double(layout().block_bytes() + 56 + 64 * 4);
  auto tier = open_tier(dir.path, kFingerprint, 4 * block_file / 1e9);
  fs::create_directories(dir.path / "ab");
  const fs::path stale = dir.path / "ab" / "00000000000000ab.kv.tmp.0123456789abcdef";
  const fs::path live = dir.path / "ab" / "00000000000000ac.kv.tmp.0123456789abcdef";
  std::ofstream(stale) << std::string(100, 'x');
  std::ofstream(live) << std::string(100, 'x');
  fs::last_write_time(stale, fs::file_time_type::clock::now() - std::chrono::hours(1));
  KvCache c(layout(), 4, kFingerprint);
  c.set_tier(tier.get());
  c.release(compute_blocks(c, tokens(64, 1), 1));
  tier->flush();
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
}

// Writing a block the directory already holds refreshes it as recently used: under a budget, a
// block that keeps coming back (evicted from RAM again) is kept over ones never seen again.
TEST(DiskTier, RewritingAnExistingObjectMarksItRecentlyUsed) {
  TempDir dir;
  auto tier = open_tier(dir.path);
  KvCache c(layout(), 4, kFingerprint);
  c.set_tier(tier.get());
  c.release(compute_blocks(c, tokens(64, 1), 1));
  tier->flush();
  const fs::path obj =
      tier->object_path(KvCache(layout(), 1, kFingerprint).chain_hash(kFingerprint, tokens(64, 1)));
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(1);
  fs::last_write_time(obj, old);
  KvCache d(layout(), 4, kFingerprint);
  d.set_tier(tier.get());
  d.release(compute_blocks(d, tokens(64, 1), 1));
  tier->flush();
  EXPECT_EQ(tier->stats().written, 1);  // not written again
  EXPECT_GT(fs::last_write_time(obj), old + std::chrono::minutes(30));
}

TEST(DiskTier, AWriteErrorTurnsWritingOffAndReadsGoOn) {
  TempDir dir;
  auto t = tokens(64, 4);
  auto tier = open_tier(dir.path);
  {
    KvCache c(layout(), 4, kFingerprint);
    c.set_tier(tier.get());
    compute_blocks(c, t, 1);
    tier->flush();
  }
  // Every fan-out directory of a new object is a regular file: its write fails.
  auto u = tokens(64, 5);
  const uint64_t hu = KvCache(layout(), 1, kFingerprint).chain_hash(kFingerprint, u);
  fs::path fan = fs::path(tier->object_path(hu)).parent_path();
  fs::remove_all(fan);
  std::ofstream(fan) << "not a directory";
  {
    KvCache c(layout(), 4, kFingerprint);
    c.set_tier(tier.get());
    compute_blocks(c, u, 2);
    tier->flush();
  }
  DiskTierStats s = tier->stats();
  EXPECT_EQ(s.write_errors, 1);
  EXPECT_TRUE(s.writes_disabled);
  if (fan !=
      fs::path(tier->object_path(KvCache(layout(), 1, kFingerprint).chain_hash(kFingerprint, t)))
          .parent_path()) {
    EXPECT_EQ(hits_after_restart(*tier, t), 1);  // reads go on
  }
}

}  // namespace
}  // namespace moeserve
