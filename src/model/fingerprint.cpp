#include "model/fingerprint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

#include "cache/kv_cache.h"

namespace moeserve {

namespace {

Result<std::string> read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return NotFound(fmt::format("{}: cannot open", p.string()));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A safetensors file's 8-byte length and JSON header.
Result<std::string> safetensors_header(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  uint64_t len = 0;
  if (!in || !in.read(reinterpret_cast<char*>(&len), 8)) {
    return Corrupt(fmt::format("{}: cannot read the safetensors header length", p.string()));
  }
  if (len > (uint64_t(1) << 30)) {
    return Corrupt(fmt::format("{}: a {} byte header", p.string(), len));
  }
  std::string h(size_t(len), '\0');
  if (!in.read(h.data(), std::streamsize(len))) {
    return Corrupt(fmt::format("{}: truncated safetensors header", p.string()));
  }
  return h;
}

// Pieces of a shard's tensor data hashed into the fingerprint: kWeightSamples pieces of
// kSampleBytes, spread evenly from the first data byte to the last. A checkpoint retrained or
// fine-tuned from another (DeepSeek-V3, V3-0324 and R1 share every header) differs in all of
// them; reading them costs ~64 KB per shard.
constexpr int kWeightSamples = 4;
constexpr size_t kSampleBytes = 16 << 10;

// The sampled bytes of one shard whose header is header_len bytes long.
Result<std::string> weight_samples(const std::filesystem::path& p, uint64_t header_len) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(p, ec);
  const uint64_t begin = 8 + header_len;
  if (ec || size < begin) return Corrupt(fmt::format("{}: shorter than its header", p.string()));
  const uint64_t span = size - begin;
  const uint64_t piece = std::min<uint64_t>(kSampleBytes, span);
  std::ifstream in(p, std::ios::binary);
  std::string out;
  std::string buf(size_t(piece), '\0');
  for (int k = 0; k < kWeightSamples && piece > 0; ++k) {
    const uint64_t at = begin + (span - piece) * uint64_t(k) / (kWeightSamples - 1);
    if (!in.seekg(std::streamoff(at)) || !in.read(buf.data(), std::streamsize(piece))) {
      return Corrupt(fmt::format("{}: cannot read its tensor data", p.string()));
    }
    out += buf;
  }
  return out;
}

}  // namespace

Result<uint64_t> model_fingerprint(const std::string& model_dir, DType kv_dtype,
                                   ComputePath compute, bool mtp, WeightFormat projections,
                                   std::optional<WeightFormat> experts) {
  namespace fs = std::filesystem;
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto add = [&](const std::string& bytes) {
    const uint64_t n = bytes.size();  // length-prefixed: no two inputs concatenate alike
    XXH3_64bits_update(st, &n, sizeof n);
    XXH3_64bits_update(st, bytes.data(), bytes.size());
  };
  Status status;
  std::vector<fs::path> files = {fs::path(model_dir) / "config.json"};
  if (fs::exists(fs::path(model_dir) / "model.safetensors.index.json")) {
    files.push_back(fs::path(model_dir) / "model.safetensors.index.json");
  }
  for (const fs::path& f : files) {
    Result<std::string> b = read_all(f);
    if (!b.ok()) {
      status = b.status();
      break;
    }
    add(*b);
  }
  std::vector<fs::path> shards;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(model_dir, ec)) {
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  }
  std::sort(shards.begin(), shards.end());
  for (size_t i = 0; i < shards.size() && status.ok(); ++i) {
    Result<std::string> h = safetensors_header(shards[i]);
    if (!h.ok()) {
      status = h.status();
      break;
    }
    add(shards[i].filename().string());
    add(*h);
    Result<std::string> w = weight_samples(shards[i], h->size());
    if (!w.ok()) {
      status = w.status();
      break;
    }
    add(*w);
  }
  add(fmt::format("kv_dtype={} compute={} layout={}", int(kv_dtype), int(compute),
                  kKvLayoutVersion));
  if (mtp) add("mtp");  // blocks then carry the MTP layer too (docs/mtp.md)
  // The projections' numerics (docs/kernels-int8.md, docs/quantization.md); INT8 keeps the
  // name it had before INT4 projections, so its caches stay valid.
  if (projections == WeightFormat::kInt8) add("gemm_int8");
  if (projections == WeightFormat::kInt4) add("projections_int4");
  // The routed experts' format when it is not the other projections' (docs/quantization.md).
  if (experts && *experts != projections) {
    add(std::string("experts_") + weight_format_name(*experts));
  }
  const uint64_t digest = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  RETURN_IF_ERROR(status);
  return digest;
}

}  // namespace moeserve
