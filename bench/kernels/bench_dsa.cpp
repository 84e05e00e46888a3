#include "bench_dsa.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "kernels/index_score.h"
#include "kernels/mla_decode.h"

namespace moeserve::bench {
namespace {

constexpr int64_t kHeads = 128, kRank = 512, kRope = 64, kDim = kRank + kRope;
constexpr int64_t kIndexHeads = 64, kTopK = 2048, kChunk = 256;
// The indexer's projections read per decode step and layer: wq_b (q_lora_rank 1536 -> 64 x 128)
// and wk (hidden 7168 -> 128) in FP8 with 128 x 128 block scales, weights_proj (7168 -> 64) BF16.
constexpr double kIndexProjBytes =
    1536.0 * 8192 * (1 + 4.0 / 16384) + 7168.0 * 128 * (1 + 4.0 / 16384) + 7168.0 * 64 * 2;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call: the best of at least `passes` calls and of as many as fit in min_s.
double best_of(const std::function<void()>& fn, int passes, double min_s) {
  fn();  // warm
  double best = 1e30;
  const double t_start = now_s();
  for (int i = 0; i < passes || now_s() - t_start < min_s; ++i) {
    const double t0 = now_s();
    fn();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

uint8_t random_e4m3(std::mt19937& rng) {
  for (;;) {
    const uint8_t b = uint8_t(rng());
    if ((b & 0x7f) != 0x7f) return b;
  }
}

// One sequence of n tokens in a paged BF16 latent cache and FP8 index-key blocks, its blocks in
// shuffled order.
struct Sequence {
  int64_t n = 0, blocks = 0;
  std::vector<uint16_t> latent;  // [blocks][64][kDim]
  std::vector<uint8_t> keys;     // [blocks][64][kIndexKeyEntryBytes]
  std::vector<int32_t> table;
  std::vector<const uint8_t*> key_blocks;  // in the sequence's order

  MlaCacheView view() const {
    return MlaCacheView{
        .blocks = latent.data(), .token = {DType::kBF16, kRank, kRope}, .num_blocks = blocks};
  }
};

Sequence make_sequence(int64_t n, std::mt19937& rng) {
  Sequence s;
  s.n = n;
  s.blocks = (n + kMlaBlockTokens - 1) / kMlaBlockTokens;
  s.latent.resize(size_t(s.blocks * kMlaBlockTokens * kDim));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (uint16_t& v : s.latent) v = f32_to_bf16(u(rng));
  s.keys.resize(size_t(s.blocks * kIndexKeyBlock * kIndexKeyEntryBytes));
  for (int64_t t = 0; t < s.blocks * kIndexKeyBlock; ++t) {
    uint8_t* k = &s.keys[size_t(t * kIndexKeyEntryBytes)];
    for (int64_t d = 0; d < kIndexKeyDim; ++d) k[d] = random_e4m3(rng);
    const float scale = std::ldexp(1.0f, -int(rng() % 8));
    std::memcpy(k + kIndexKeyDim, &scale, 4);
  }
  s.table.resize(size_t(s.blocks));
  std::iota(s.table.begin(), s.table.end(), 0);
  std::shuffle(s.table.begin(), s.table.end(), rng);
  // The index keys follow the same shuffled blocks.
  for (int64_t b = 0; b < s.blocks; ++b) {
    s.key_blocks.push_back(
        &s.keys[size_t(s.table[size_t(b)] * kIndexKeyBlock * kIndexKeyEntryBytes)]);
  }
  return s;
}

// Queries of `rows` new tokens: absorbed MLA queries (F32, as the model gives them), the
// indexer's FP8 queries and weights.
struct Queries {
  std::vector<float> q;
  std::vector<uint8_t> q8;
  std::vector<float> w;
  Queries(int64_t rows, std::mt19937& rng)
      : q(size_t(rows * kHeads * kDim)),
        q8(size_t(rows * kIndexHeads * kIndexKeyDim)),
        w(size_t(rows * kIndexHeads)) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& v : q) v = u(rng);
    for (uint8_t& v : q8) v = random_e4m3(rng);
    for (float& v : w) v = u(rng) * 1e-2f;
  }
};

MlaShape shape() {
  return MlaShape{kHeads, kRank, kRope, 1.0f / std::sqrt(192.0f)};
}

MlaOptions mla_options() {
  MlaOptions o;
  o.split_blocks = 4;  // as the model runs it
  return o;
}

// The attention of `rows` new tokens ending at position `end` of s (causal), dense.
void dense_chunk(const Sequence& s, const Queries& qs, int64_t rows, int64_t end,
                 std::vector<float>& o, ThreadPool& pool) {
  const MlaSequence seq{s.table, end, rows};
  o.resize(size_t(rows * kHeads * kRank));
  mla_decode(
      MlaBatch{shape(), s.view(), std::span(&seq, 1), qs.q.data(), DType::kF32, o.data(), nullptr},
      &pool, mla_options());
}

// The same with DSA: the indexer's top-k, then rows whose context fits the top-k densely and
// the others over their selection. Returns {indexer seconds, attention seconds}.
std::pair<double, double> dsa_chunk(const Sequence& s, const Queries& qs, int64_t rows, int64_t end,
                                    std::vector<float>& o, ThreadPool& pool) {
  const double t0 = now_s();
  std::vector<std::vector<int32_t>> sel;
  const IndexRows ir{qs.q8.data(), qs.w.data(), rows, end - rows, IndexKeys{s.key_blocks}};
  index_topk(std::span(&ir, 1), kIndexHeads, kTopK, &pool, sel);
  const double t1 = now_s();
  o.resize(size_t(rows * kHeads * kRank));
  int64_t dense = 0;
  while (dense < rows && sel[size_t(dense)].empty()) ++dense;
  if (dense > 0) {
    const MlaSequence seq{s.table, end - rows + dense, dense};
    mla_decode(MlaBatch{shape(), s.view(), std::span(&seq, 1), qs.q.data(), DType::kF32, o.data(),
                        nullptr},
               &pool, mla_options());
  }
  if (dense < rows) {
    std::vector<MlaSparseQuery> queries;
    for (int64_t i = dense; i < rows; ++i) queries.push_back({s.table, sel[size_t(i)]});
    mla_sparse(MlaSparseBatch{shape(), s.view(), queries, qs.q.data() + dense * kHeads * kDim,
                              DType::kF32, o.data() + dense * kHeads * kRank, nullptr},
               &pool, mla_options());
  }
  return {t1 - t0, now_s() - t1};
}

// Linear interpolation of cost(p) between sampled positions, summed over the chunk ends
// 256, 512, ..., n.
double integrate(const std::map<int64_t, double>& cost, int64_t n) {
  double total = 0;
  for (int64_t p = kChunk; p <= n; p += kChunk) {
    auto hi = cost.lower_bound(p);
    if (hi->first == p) {
      total += hi->second;
      continue;
    }
    auto lo = std::prev(hi);
    const double f = double(p - lo->first) / double(hi->first - lo->first);
    total += lo->second + f * (hi->second - lo->second);
  }
  return total;
}

}  // namespace

void run_dsa_benches(const DsaBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool) {
  std::mt19937 rng(32);
  const std::vector<int64_t> decode_ctx = opt.quick
                                              ? std::vector<int64_t>{4096, 16384}
                                              : std::vector<int64_t>{4096, 16384, 65536, 131072};
  const std::vector<int64_t> prefill_ctx = opt.decode_only ? std::vector<int64_t>{}
                                           : opt.quick     ? std::vector<int64_t>{8192}
                                                       : std::vector<int64_t>{8192, 32768, 131072};
  const int64_t longest =
      std::max(decode_ctx.back(), prefill_ctx.empty() ? int64_t(0) : prefill_ctx.back());
  const Sequence seq = make_sequence(longest, rng);
  // The ceilings again, now: the run's first reading may have shared the cores with whatever ran
  // before (the better of the two readings is the machine's).
  const Ceilings now = measure_ceilings(pool);
  const double peak = std::max(ceil.gemm_peak_gflops(), now.gemm_peak_gflops()) * 1e9;
  const double dram = std::max(ceil.dram_read_gbps, now.dram_read_gbps) * 1e9;
  if (!opt.json) {
    fmt::print(
        "dsa: one layer's attention at V3.2's widths (128 heads, 512 + 64 BF16 latent, "
        "indexer 64 x 128, top-k 2048); DRAM {:.1f} GB/s, peak {:.0f} GFLOP/s\n",
        dram / 1e9, peak / 1e9);
    fmt::print("{:>8} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8} {:>11} {:>11} {:>9}\n", "decode",
               "dense ms", "dsa ms", "index ms", "sparse ms", "proj ms", "dense/dsa",
               "dense MB/tok", "dsa MB/tok", "idx/roof");
  }
  // Decode: one query at the end of the context.
  Queries one(1, rng);
  std::vector<float> o;
  for (const int64_t n : decode_ctx) {
    const double t_dense = best_of([&] { dense_chunk(seq, one, 1, n, o, pool); }, 3, 0.5);
    double t_index = 1e30, t_sparse = 1e30;
    dsa_chunk(seq, one, 1, n, o, pool);  // warm
    const double t_start = now_s();
    for (int i = 0; i < 3 || now_s() - t_start < 0.5; ++i) {
      auto [ti, ta] = dsa_chunk(seq, one, 1, n, o, pool);
      t_index = std::min(t_index, ti);
      t_sparse = std::min(t_sparse, ta);
    }
    const double t_proj = kIndexProjBytes / dram;  // roofline: weight reads at the DRAM ceiling
    const double t_dsa = t_index + t_sparse + t_proj;
    const double dense_bytes = double(n) * kDim * 2;
    const double dsa_bytes =
        double(n) * kIndexKeyEntryBytes + double(kTopK) * kDim * 2 + kIndexProjBytes;
    // The indexer's roofline: its dot products at the peak or its keys at the DRAM ceiling.
    const double index_roof = std::max(2.0 * kIndexHeads * kIndexKeyDim * double(n) / peak,
                                       double(n) * kIndexKeyEntryBytes / dram);
    if (opt.json) {
      nlohmann::json j = {{"bench", "dsa_decode"},
                          {"context", n},
                          {"dense_s", t_dense},
                          {"dsa_s", t_dsa},
                          {"index_s", t_index},
                          {"sparse_s", t_sparse},
                          {"proj_roofline_s", t_proj},
                          {"dense_over_dsa", t_dense / t_dsa},
                          {"dense_bytes", dense_bytes},
                          {"dsa_bytes", dsa_bytes},
                          {"index_roofline_share", index_roof / t_index}};
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print(
          "{:>8} {:>10.2f} {:>10.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>8.1f}x {:>11.1f} {:>11.1f} "
          "{:>9.2f}\n",
          n, t_dense * 1e3, t_dsa * 1e3, t_index * 1e3, t_sparse * 1e3, t_proj * 1e3,
          t_dense / t_dsa, dense_bytes / 1e6, dsa_bytes / 1e6, index_roof / t_index);
    }
  }
  // Prefill: 256-token chunks timed at sampled end positions, the rest interpolated.
  std::vector<int64_t> samples = {kChunk, kTopK};
  for (const int64_t n : prefill_ctx) {
    for (int q = 1; q <= 4; ++q) samples.push_back(n * q / 4);
  }
  std::sort(samples.begin(), samples.end());
  samples.erase(std::unique(samples.begin(), samples.end()), samples.end());
  Queries chunk(kChunk, rng);
  std::map<int64_t, double> dense_cost, dsa_cost;
  for (const int64_t p : samples) {
    double t0 = now_s();
    dense_chunk(seq, chunk, kChunk, p, o, pool);
    dense_cost[p] = now_s() - t0;
    auto [ti, ta] = dsa_chunk(seq, chunk, kChunk, p, o, pool);
    dsa_cost[p] = ti + ta + kIndexProjBytes / dram / 16;  // (projections: batched, ~free)
  }
  if (!opt.json) {
    fmt::print("{:>8} {:>12} {:>12} {:>9} {:>22}\n", "prefill", "dense s", "dsa s", "dense/dsa",
               "check (whole, s)");
  }
  for (const int64_t n : prefill_ctx) {
    const double dense_est = integrate(dense_cost, n), dsa_est = integrate(dsa_cost, n);
    std::string check = "-";
    double dense_whole = 0, dsa_whole = 0;
    if (n <= 8192) {  // timed whole, chunk by chunk, as the estimate's check
      for (int64_t p = kChunk; p <= n; p += kChunk) {
        double t0 = now_s();
        dense_chunk(seq, chunk, kChunk, p, o, pool);
        dense_whole += now_s() - t0;
        auto [ti, ta] = dsa_chunk(seq, chunk, kChunk, p, o, pool);
        dsa_whole += ti + ta;
      }
      check = fmt::format("{:.3f} / {:.3f}", dense_whole, dsa_whole);
    }
    if (opt.json) {
      nlohmann::json j = {{"bench", "dsa_prefill"},
                          {"context", n},
                          {"dense_s", dense_est},
                          {"dsa_s", dsa_est},
                          {"dense_over_dsa", dense_est / dsa_est}};
      if (dense_whole > 0) j["dense_whole_s"] = dense_whole, j["dsa_whole_s"] = dsa_whole;
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("{:>8} {:>12.3f} {:>12.3f} {:>8.1f}x {:>22}\n", n, dense_est, dsa_est,
                 dense_est / dsa_est, check);
    }
  }
}

}  // namespace moeserve::bench
