// kv-disk-bench: the disk tier's read throughput against a plain sequential read of the same
// files, measured in the same run (docs/kv-cache.md "Bench").
//
// Writes --blocks objects of one KV block each (DeepSeek-V3's layout by default: 61 layers x
// 64 tokens x 576 BF16 values = 4.5 MB; 2.6 MB in FP8) through DiskTier, then alternates two passes
// over all of them, --rounds times:
//   plain, buffer: open, read() the whole file into one reused 1 MB buffer, close (cat);
//   plain, pool:   the same, each file into its own block of a pool (where a loader must put
//                  the bytes: the ceiling for any reader that lands KV in RAM blocks);
//   tier:          one KvCache load job for the whole chain, as admission starts it: the tier's
//                  reader thread preads each object into its RAM block and verifies it.
// Warm: the files are in the page cache (just written or read). Cold: before every pass each
// file's pages are dropped with posix_fadvise(POSIX_FADV_DONTNEED) (after an fsync, so they are
// clean), so both passes read from the device.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cache/disk_tier.h"
#include "cache/kv_cache.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

struct Options {
  std::string dir;
  int32_t blocks = 64;
  int64_t layers = 61;
  int64_t kv_lora_rank = 512;
  int64_t rope_dim = 64;
  std::string kv_dtype = "bf16";
  int rounds = 5;
  bool cold = true;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

std::vector<int32_t> chain_tokens(int32_t blocks) {
  std::vector<int32_t> t(size_t(blocks) * kKvBlockSize);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * 2654435761u) % 129280);
  return t;
}

// Every object file under dir.
std::vector<fs::path> objects(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".kv") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void drop_pages(const std::vector<fs::path>& files) {
  for (const fs::path& p : files) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// A plain sequential read of every file: into one reused buffer (cat's ceiling) when dest is
// null, else each file whole into its own dest block (block_stride bytes apart), as a loader
// that lands bytes in the KV pool must. Returns the bytes read.
int64_t plain_pass(const std::vector<fs::path>& files, std::vector<uint8_t>& buf, uint8_t* dest,
                   size_t block_stride) {
  int64_t total = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    int fd = ::open(files[f].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    uint8_t* at = dest ? dest + f * block_stride : nullptr;
    ssize_t r;
    while ((r = ::read(fd, at ? at : buf.data(), buf.size())) > 0) {
      total += r;
      if (at) at += r;
    }
    ::close(fd);
  }
  return total;
}

int run(const Options& o) {
  const KvLayout layout{
      o.layers, {o.kv_dtype == "fp8" ? DType::kF8E4M3 : DType::kBF16, o.kv_lora_rank, o.rope_dim}};
  const int64_t dim = o.kv_lora_rank + o.rope_dim;
  const size_t block_bytes = layout.block_bytes();
  const uint64_t fingerprint = 0x6b766469736bull;
  const std::vector<int32_t> tokens = chain_tokens(o.blocks);
  auto tier = DiskTier::open({o.dir, 0, o.blocks}, fingerprint, block_bytes);
  if (!tier.ok()) {
    fmt::print(stderr, "kv-disk-bench: {}\n", tier.status().message());
    return 1;
  }
  {
    // The chain's objects, written as a server registering a prompt would.
    KvCache cache(layout, o.blocks, fingerprint);
    cache.set_tier(tier->get());
    std::vector<int32_t> table;
    if (!cache.allocate(o.blocks, &table)) return 1;
    std::vector<float> v(static_cast<size_t>(dim));
    for (int64_t l = 0; l < o.layers; ++l) {
      for (int64_t p = 0; p < int64_t(tokens.size()); ++p) {
        for (int64_t i = 0; i < dim; ++i) v[size_t(i)] = float((p * 31 + i * 7 + l) % 97) * 0.01f;
        cache.write(l, table, p, v.data());
      }
    }
    uint64_t parent = fingerprint;
    for (int32_t b = 0; b < o.blocks; ++b) {
      auto bt = std::span<const int32_t>(tokens).subspan(size_t(b) * kKvBlockSize, kKvBlockSize);
      const uint64_t h = cache.chain_hash(parent, bt);
      cache.register_block(table[size_t(b)], h, parent, bt);
      parent = h;
    }
    (*tier)->flush();
    cache.release(table);
  }
  const std::vector<fs::path> files = objects(o.dir);
  if (int32_t(files.size()) != o.blocks) {
    fmt::print(stderr, "kv-disk-bench: {} objects written of {}\n", files.size(), o.blocks);
    return 1;
  }
  double file_bytes = 0;
  for (const fs::path& p : files) file_bytes += double(fs::file_size(p));

  fmt::print("kv-disk-bench  cpu: {}  dir: {}\n", cpu_model(), o.dir);
  fmt::print(
      "{} objects of {:.2f} MB ({} layers x 64 tokens x {} + {} values, {}), {:.0f} MB in "
      "all\n",
      o.blocks, file_bytes / o.blocks / 1e6, o.layers, o.kv_lora_rank, o.rope_dim, o.kv_dtype,
      file_bytes / 1e6);
  std::vector<uint8_t> buf(size_t(1) << 20);
  // The plain reads' pool: one block of file size per object (+ a page), touched before timing.
  const size_t stride = (size_t(file_bytes) / files.size() + 4096) & ~size_t(4095);
  std::vector<uint8_t> pool(stride * files.size(), 1);
  fmt::print(
      "| page cache | plain read, reused 1 MB buffer | plain read into pool blocks | tier load "
      "(verified) | tier / plain into pool | tier / plain buffer "
      "|\n|---|---:|---:|---:|---:|---:|\n");
  for (bool cold : {false, true}) {
    if (cold && !o.cold) continue;
    std::vector<double> plain, into_pool, tiered;
    for (int r = 0; r < o.rounds; ++r) {
      if (cold) drop_pages(files);
      double t0 = now_s();
      int64_t got = plain_pass(files, buf, nullptr, 0);
      plain.push_back(double(got) / (now_s() - t0) / 1e9);

      if (cold) drop_pages(files);
      t0 = now_s();
      got = plain_pass(files, buf, pool.data(), stride);
      into_pool.push_back(double(got) / (now_s() - t0) / 1e9);

      if (cold) drop_pages(files);
      KvCache cache(layout, o.blocks, fingerprint);
      cache.set_tier(tier->get());
      std::vector<int32_t> table;
      t0 = now_s();
      auto job = cache.start_load(tokens, 0, o.blocks, fingerprint, &table);
      if (!job) return fmt::print(stderr, "kv-disk-bench: the tier lost its objects\n"), 1;
      while (!job->finished()) cache.wait_for_load();
      const double dt = now_s() - t0;
      std::vector<uint64_t> hashes;
      if (cache.finish_load(*job, table, &hashes) != o.blocks) {
        fmt::print(stderr, "kv-disk-bench: a load stopped early\n");
        return 1;
      }
      tiered.push_back(file_bytes / dt / 1e9);
      cache.release(table);
    }
    for (auto* v : {&plain, &into_pool, &tiered}) std::sort(v->begin(), v->end());
    auto med = [](const std::vector<double>& v) { return v[v.size() / 2]; };
    fmt::print(
        "| {} (median of {}) | {:.2f} GB/s | {:.2f} GB/s | {:.2f} GB/s | {:.2f} | {:.2f} |\n",
        cold ? "cold" : "warm", o.rounds, med(plain), med(into_pool), med(tiered),
        med(tiered) / med(into_pool), med(tiered) / med(plain));
  }
  const DiskTierStats s = (*tier)->stats();
  int64_t rejected = 0;
  for (int64_t r : s.rejected) rejected += r;
  fmt::print("tier: {} hits, {} misses, {} rejected\n", s.hits, s.misses, rejected);
  return rejected == 0 ? 0 : 1;
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  moeserve::Options o;
  CLI::App app{"The KV disk tier's read throughput vs a plain sequential read of its files"};
  app.add_option("--dir", o.dir, "Directory for the objects (default: a fresh one under /tmp)");
  app.add_option("--blocks", o.blocks, "Objects (one KV block each)")->check(CLI::Range(1, 4096));
  app.add_option("--layers", o.layers, "Layers per block (DeepSeek-V3: 61)");
  app.add_option("--kv-lora-rank", o.kv_lora_rank, "Latent values per token per layer (V3: 512)");
  app.add_option("--rope-dim", o.rope_dim, "Rope-key values per token per layer (V3: 64)");
  app.add_option("--kv-cache-dtype", o.kv_dtype, "The KV format: bf16 | fp8")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  app.add_option("--rounds", o.rounds, "Alternated passes of each")->check(CLI::Range(1, 100));
  app.add_flag("!--no-cold", o.cold, "Skip the cold (page cache dropped) passes");
  CLI11_PARSE(app, argc, argv);
  bool own_dir = o.dir.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/kv-disk-bench.XXXXXX";
    if (!::mkdtemp(tmpl)) return 1;
    o.dir = tmpl;
  }
  int rc = moeserve::run(o);
  if (own_dir) std::filesystem::remove_all(o.dir);
  return rc;
}
