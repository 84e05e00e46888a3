#include "bench_mla.h"

#include <fmt/core.h>
#include <immintrin.h>
#include <math.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu_features.h"
#include "kernels/kv_token.h"
#include "kernels/mla_decode.h"

namespace moeserve::bench {
namespace {

constexpr int64_t kRank = 512, kRope = 64, kDim = kRank + kRope;  // DeepSeek-V3
constexpr float kScale = 0.1352f;  // 1/sqrt(192) * YaRN mscale^2 for V3, about

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

// A random BF16 value in +-[2^-7, 1): random sign, exponent and mantissa bits.
uint16_t random_bf16_bits(uint16_t r) {
  return uint16_t((r & 0x8000) | ((120 + (r >> 7 & 7)) << 7) | (r & 0x7f));
}

constexpr KvTokenFormat kFp8Token{DType::kF8E4M3, kRank, kRope};  // FlashMLA's: 656 bytes

// `copies` batches of `batch` sequences of `context` tokens each (the last `queries` of them
// being queried), every copy on its own shuffled blocks of one pool; with fp8, the same values
// quantized into a second pool in FlashMLA's FP8 format (same block ids).
struct CacheSet {
  int64_t batch = 0, context = 0, queries = 0, copies = 0, num_blocks = 0;
  std::unique_ptr<uint16_t[], void (*)(void*)> pool{nullptr, std::free};
  std::unique_ptr<uint8_t[], void (*)(void*)> pool8{nullptr, std::free};
  std::vector<std::vector<int32_t>> tables;    // [copies * batch]
  std::vector<std::vector<MlaSequence>> seqs;  // [copies][batch]

  double cache_bytes() const { return double(batch * context * kDim * 2); }  // per copy
};

// rotate: enough copies to span dram_stream_bytes() (decode reads DRAM); otherwise two copies
// (prefill is compute-bound many times over, and all-copy passes would take minutes).
CacheSet make_cache(int64_t batch, int64_t context, int64_t queries, bool rotate, Rng& rng,
                    bool fp8 = false) {
  CacheSet c;
  c.batch = batch;
  c.context = context;
  c.queries = queries;
  c.copies = 2;
  const int64_t blocks_per_seq = (context + kMlaBlockTokens - 1) / kMlaBlockTokens;
  if (rotate)
    c.copies = std::max<int64_t>(1, int64_t(std::ceil(dram_stream_bytes() / c.cache_bytes())));
  c.num_blocks = c.copies * batch * blocks_per_seq;
  const size_t elems = size_t(c.num_blocks * kMlaBlockTokens * kDim);
  c.pool.reset(static_cast<uint16_t*>(std::aligned_alloc(64, elems * 2)));
  for (size_t i = 0; i < elems; i += 4) {
    uint64_t r = rng.next();
    for (size_t j = 0; j < 4; ++j) c.pool[i + j] = random_bf16_bits(uint16_t(r >> (16 * j)));
  }
  if (fp8) {
    const size_t tokens = size_t(c.num_blocks * kMlaBlockTokens), tb = size_t(kFp8Token.bytes());
    c.pool8.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (tokens * tb + 63) / 64 * 64)));
    std::vector<float> v(static_cast<size_t>(kDim));
    for (size_t t = 0; t < tokens; ++t) {
      for (int64_t d = 0; d < kDim; ++d) v[size_t(d)] = bf16_to_f32(c.pool[t * kDim + size_t(d)]);
      kv_token_store(kFp8Token, v.data(), &c.pool8[t * tb]);
    }
  }
  std::vector<int32_t> ids(static_cast<size_t>(c.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.next() % i]);
  c.tables.resize(size_t(c.copies * batch));
  c.seqs.resize(size_t(c.copies));
  size_t next = 0;
  for (int64_t cp = 0; cp < c.copies; ++cp) {
    for (int64_t s = 0; s < batch; ++s) {
      std::vector<int32_t>& t = c.tables[size_t(cp * batch + s)];
      t.assign(ids.begin() + long(next), ids.begin() + long(next + size_t(blocks_per_seq)));
      next += size_t(blocks_per_seq);
    }
  }
  for (int64_t cp = 0; cp < c.copies; ++cp) {
    for (int64_t s = 0; s < batch; ++s) {
      c.seqs[size_t(cp)].push_back(MlaSequence{c.tables[size_t(cp * batch + s)], context, queries});
    }
  }
  return c;
}

// Seconds per call of fn(copy): the best pass over all copies after one untimed call (the
// machine may be shared; the ceilings are measured the same way).
double time_calls(const std::function<void(int)>& fn, int copies, double min_s, int min_passes) {
  fn(copies - 1);
  double best = 1e30, t_start = now_s();
  int passes = 0;
  while (passes < min_passes || now_s() - t_start < min_s) {
    double t0 = now_s();
    for (int i = 0; i < copies; ++i) fn(i);
    best = std::min(best, (now_s() - t0) / copies);
    ++passes;
  }
  return best;
}

// ---- The baseline: straightforward per-head attention, one token at a time (online softmax),
// reading the cache once per head. AVX-512 BF16 for the dot product, F32 FMAs for P V. Plain
// functions on raw pointers only: no library templates are compiled for this target.
#pragma GCC push_options
// GCC 12's intrinsics headers trip -Wmaybe-uninitialized (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

struct BaseRow {
  const int32_t* table;
  int64_t n;          // tokens visible
  const uint16_t* q;  // [kDim]
  float* o;           // [kRank]
  float* lse;
};

void baseline_row(const uint16_t* pool, const BaseRow& r) {
  __m512 acc[kRank / 16];
  for (int j = 0; j < kRank / 16; ++j) acc[j] = _mm512_setzero_ps();
  float m = -INFINITY, l = 0;
  for (int64_t t = 0; t < r.n; ++t) {
    const uint16_t* k =
        pool +
        (int64_t(r.table[t / kMlaBlockTokens]) * kMlaBlockTokens + t % kMlaBlockTokens) * kDim;
    __m512 d = _mm512_setzero_ps();
    for (int64_t i = 0; i < kDim; i += 32) {
      __m512i a = _mm512_loadu_si512(r.q + i), b = _mm512_loadu_si512(k + i);
      d = _mm512_dpbf16_ps(d, reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
    }
    const float s = _mm512_reduce_add_ps(d) * kScale;
    if (s > m) {
      const float alpha = expf(m - s);
      const __m512 va = _mm512_set1_ps(alpha);
      for (int j = 0; j < kRank / 16; ++j) acc[j] = _mm512_mul_ps(acc[j], va);
      l *= alpha;
      m = s;
    }
    const float p = expf(s - m);
    l += p;
    const __m512 vp = _mm512_set1_ps(p);
    for (int j = 0; j < kRank / 16; ++j) {
      __m256i v16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 16 * j));
      __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v16), 16));
      acc[j] = _mm512_fmadd_ps(vp, v, acc[j]);
    }
  }
  const __m512 inv = _mm512_set1_ps(1.0f / l);
  for (int j = 0; j < kRank / 16; ++j) _mm512_storeu_ps(r.o + 16 * j, _mm512_mul_ps(acc[j], inv));
  *r.lse = m + logf(l);
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

void baseline(const CacheSet& c, int copy, int64_t heads, const uint16_t* q, float* o, float* lse,
              ThreadPool& pool) {
  const int64_t rows = c.batch * c.queries * heads;  // (sequence, query, head)
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t qrow = r / heads, s = qrow / c.queries, i = qrow % c.queries;
      const MlaSequence& seq = c.seqs[size_t(copy)][size_t(s)];
      BaseRow br{seq.block_table.data(), seq.context_len - seq.n_queries + i + 1, q + r * kDim,
                 o + r * kRank, lse + r};
      baseline_row(c.pool.get(), br);
    }
  });
}

// ---- Cases.

struct Case {
  const char* kernel;
  int64_t batch, context, heads, queries;
  bool q_f32 = false;        // F32 queries (the model's fast path) instead of BF16
  int64_t split_blocks = 0;  // MlaOptions::split_blocks (the model passes 4)
  bool fp8 = false;          // the FP8 cache; its baseline is the same call on the BF16 cache
};

void report(const MlaBenchOptions& opt, const Ceilings& ceil, const Case& c, double t,
            double t_base) {
  // Bytes: the latent cache read once. FLOPs: scores (dim MACs) and P V (rank MACs) per visible
  // (query, token, head).
  const double bytes = double(c.batch * c.context * (c.fp8 ? kFp8Token.bytes() : kDim * 2));
  double visible = 0;  // (query, token) pairs per sequence, causal
  for (int64_t i = 0; i < c.queries; ++i) visible += double(c.context - c.queries + i + 1);
  const double flops = 2.0 * double(c.batch) * visible * double(c.heads) * double(kDim + kRank);
  const double t_mem = bytes / (ceil.dram_read_gbps * 1e9);
  // The compute ceiling of the level that runs: the AMX BF16 peak at the AMX level (its kernel
  // runs both products on the tile unit), else the vdpbf16ps peak.
  const double peak = ceil.gemm_peak_gflops();
  const double t_cmp = peak > 0 ? flops / (peak * 1e9) : 0;
  const double t_roof = std::max(t_mem, t_cmp);
  const double gbps = bytes / t / 1e9, gflops = flops / t / 1e9;
  const char* bound = t_mem >= t_cmp ? "memory" : "compute";
  if (opt.json) {
    nlohmann::json j = {{"kernel", c.kernel},
                        {"batch", c.batch},
                        {"context", c.context},
                        {"heads", c.heads},
                        {"gbps", gbps},
                        {"gflops", gflops},
                        {"ceiling_ratio", t_roof / t},
                        {"dram_ratio", gbps / ceil.dram_read_gbps},
                        {"peak_ratio", gflops / peak},
                        {"baseline_ratio", t_base / t},
                        {"baseline", c.fp8 ? "mla_decode on the BF16 cache"
                                           : "per-head AVX-512, one token at a time"},
                        {"bound", bound},
                        {"seconds", t},
                        {"baseline_seconds", t_base},
                        {"dram_read_gbps", ceil.dram_read_gbps},
                        {"bf16_peak_gflops", ceil.bf16_peak_gflops},
                        {"peak_gflops", peak},
                        {"isa", isa_name(active_isa())}};
    if (c.queries > 1) j["queries"] = c.queries;
    j["q_dtype"] = c.q_f32 ? "f32" : "bf16";
    j["cache_dtype"] = c.fp8 ? "fp8" : "bf16";
    if (c.split_blocks > 0) j["split_blocks"] = c.split_blocks;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print(
        "{:<12} {:>5} {:>6} {:>5} {:>5} {:>8.1f} {:>8.1f} {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f}  "
        "{}{}\n",
        c.kernel, c.batch, c.context, c.heads, c.queries, gbps, gflops, t_roof / t,
        gbps / ceil.dram_read_gbps, gflops / peak, t_base / t, bound,
        c.q_f32 ? fmt::format("  f32 q, split {}", c.split_blocks)
        : c.fp8 ? std::string("  fp8 cache (base: the bf16 cache)")
                : std::string());
  }
  std::fflush(stdout);
}

// q_f32: the queries as F32 (the same values), as the model passes them (the BF16 level then
// carries them as BF16 hi + lo pairs); split_blocks as MlaOptions. t_bf16 > 0: run on the FP8
// pool, with the BF16 cache's time t_bf16 as the baseline. Returns the seconds per call.
double run_case(const MlaBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool,
                const CacheSet& c, const char* kernel, int64_t heads, Rng& rng, bool q_f32 = false,
                int64_t split_blocks = 0, double t_bf16 = 0) {
  const bool fp8 = t_bf16 > 0;
  const int64_t rows = c.batch * c.queries * heads;
  std::vector<uint16_t> q(size_t(rows * kDim));
  for (auto& v : q) v = random_bf16_bits(uint16_t(rng.next()));
  std::vector<float> qf;
  if (q_f32) {
    qf.resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) qf[i] = bf16_to_f32(q[i]);
  }
  std::vector<float> o(size_t(rows * kRank)), lse(static_cast<size_t>(rows));
  const double min_s = opt.quick ? 0.1 : 0.3;
  auto batch_of = [&](int copy) {
    MlaBatch b;
    b.shape = MlaShape{heads, kRank, kRope, kScale};
    b.cache = fp8 ? MlaCacheView{.blocks = c.pool8.get(), .token = kFp8Token}
                  : MlaCacheView{.blocks = c.pool.get(), .token = {DType::kBF16, kRank, kRope}};
    b.cache.num_blocks = c.num_blocks;
    b.seqs = c.seqs[size_t(copy)];
    b.q = q_f32 ? static_cast<const void*>(qf.data()) : static_cast<const void*>(q.data());
    b.q_dtype = q_f32 ? DType::kF32 : DType::kBF16;
    b.o = o.data();
    b.lse = lse.data();
    return b;
  };
  MlaOptions mla_opt;
  mla_opt.split_blocks = split_blocks;
  const double dram_before = measure_dram_read_gbps(pool, 1, min_s);
  const double t =
      time_calls([&](int i) { mla_decode(batch_of(i), &pool, mla_opt); }, int(c.copies), min_s, 3);
  const Ceilings here = local_ceilings(ceil, dram_before, pool, min_s);
  double t_base = t_bf16;
  if (!fp8 && cpu_isa() >= Isa::kAvx512Bf16) {
    // The baseline is several times slower: one timed pass is enough to rank it.
    t_base = time_calls([&](int i) { baseline(c, i, heads, q.data(), o.data(), lse.data(), pool); },
                        int(c.copies), 0.0, 1);
  }
  report(opt, here, Case{kernel, c.batch, c.context, heads, c.queries, q_f32, split_blocks, fp8}, t,
         t_base);
  return t;
}

}  // namespace

void run_mla_benches(const MlaBenchOptions& opt, const Ceilings& ceil, ThreadPool& pool) {
  Rng rng{0x2545f4914f6cdd1dull};
  if (!opt.json) {
    fmt::print("{:<12} {:>5} {:>6} {:>5} {:>5} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6}  {}\n", "kernel",
               "batch", "ctx", "heads", "q", "GB/s", "GFLOP/s", "ceil", "dram", "peak", "base",
               "bound");
  }
  std::vector<int64_t> contexts = {1024, 4096, 16384}, batches = {1, 8, 32};
  if (opt.quick) {
    contexts = {4096};
    batches = {1, 8};
  }
  for (int64_t ctx : contexts) {
    for (int64_t batch : batches) {
      const CacheSet c = make_cache(batch, ctx, 1, /*rotate=*/true, rng, /*fp8=*/true);
      for (int64_t heads : {16, 128}) {
        const double t = run_case(opt, ceil, pool, c, "mla_decode", heads, rng);
        run_case(opt, ceil, pool, c, "mla_decode", heads, rng, false, 0, /*t_bf16=*/t);
      }
    }
  }
  // Decode as the model runs it (F32 queries, KV cut every 4 blocks), one sequence at short
  // contexts: under 4 blocks it is one piece, so its 128 heads are what spreads over the threads.
  for (int64_t ctx : {192, 1024}) {
    const CacheSet c = make_cache(1, ctx, 1, /*rotate=*/true, rng, /*fp8=*/false);
    run_case(opt, ceil, pool, c, "mla_decode", 128, rng, /*q_f32=*/true, /*split_blocks=*/4);
  }
  // Prefill as the model runs it (F32 queries, KV cut every 4 blocks), 16 heads: a 128-query
  // chunk at the end of a 2k context, and (not --quick) a whole 2k prompt as one chunk.
  {
    const CacheSet c = make_cache(1, 2048, 128, /*rotate=*/false, rng);
    run_case(opt, ceil, pool, c, "mla_prefill", 16, rng, /*q_f32=*/true, /*split_blocks=*/4);
  }
  if (opt.quick) return;
  {
    const CacheSet c = make_cache(1, 2048, 2048, /*rotate=*/false, rng);
    run_case(opt, ceil, pool, c, "mla_prefill", 16, rng, /*q_f32=*/true, /*split_blocks=*/4);
  }
  // Prefill: one whole prompt as one causal chunk.
  struct Prefill {
    int64_t n, heads;
  };
  for (Prefill p : {Prefill{2048, 16}, Prefill{1024, 128}}) {
    const CacheSet c = make_cache(1, p.n, p.n, /*rotate=*/false, rng);
    run_case(opt, ceil, pool, c, "mla_prefill", p.heads, rng);
  }
}

}  // namespace moeserve::bench
