// mla_sparse (kernels/mla_decode.h) at every ISA level this CPU runs against a naive
// double-precision attention over each query's selected tokens, on shuffled block tables, BF16
// and FP8 caches, BF16 and F32 queries, selections of 1 token to a whole context, more rows
// than one gathering wave; and a row's bits do not depend on the rest of the batch.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "../test_isa.h"
#include "kernels/mla_decode.h"
#include "mla_test_util.h"

namespace moeserve {
namespace {

using namespace mla_test;

struct Sparse {
  std::vector<std::vector<int32_t>> positions;  // per query row
  std::vector<MlaSparseQuery> queries;
};

// Query row i (sequence i % seqs) attends to sizes[i] of its tokens chosen at random, ascending.
Sparse select(const Problem& p, const std::vector<int64_t>& sizes, uint32_t seed) {
  std::mt19937 rng(seed);
  Sparse s;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const MlaSequence& seq = p.seqs[i % p.seqs.size()];
    std::vector<int32_t> all(size_t(seq.context_len));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(size_t(std::min(sizes[i], seq.context_len)));
    std::sort(all.begin(), all.end());
    s.positions.push_back(std::move(all));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    s.queries.push_back({p.tables[i % p.seqs.size()], s.positions[i]});
  }
  return s;
}

// Naive attention in double of query row i over its selected tokens (the values of pool32).
Attention naive_sparse(const Problem& p, const Sparse& s, const std::vector<float>& q) {
  const int64_t H = p.shape.heads, R = p.shape.kv_lora_rank, D = p.shape.dim();
  const int64_t rows = int64_t(s.queries.size());
  Attention r{std::vector<double>(size_t(rows * H * R)), std::vector<double>(size_t(rows * H))};
  for (int64_t i = 0; i < rows; ++i) {
    const MlaSparseQuery& sq = s.queries[size_t(i)];
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = &q[size_t((i * H + h) * D)];
      std::vector<double> sc;
      double mx = -INFINITY;
      for (int32_t pos : sq.positions) {
        const float* tok =
            &p.pool32[size_t((sq.block_table[size_t(pos / 64)] * 64 + pos % 64) * D)];
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += double(qh[d]) * tok[d];
        sc.push_back(dot * p.shape.softmax_scale);
        mx = std::max(mx, sc.back());
      }
      double sum = 0;
      for (double& v : sc) sum += (v = std::exp(v - mx));
      double* o = &r.o[size_t((i * H + h) * R)];
      for (size_t t = 0; t < sc.size(); ++t) {
        const int32_t pos = sq.positions[t];
        const float* tok =
            &p.pool32[size_t((sq.block_table[size_t(pos / 64)] * 64 + pos % 64) * D)];
        for (int64_t j = 0; j < R; ++j) o[j] += sc[t] / sum * tok[j];
      }
      r.lse[size_t(i * H + h)] = mx + std::log(sum);
    }
  }
  return r;
}

Output run_sparse(const Problem& p, const Sparse& s, ThreadPool* pool, Isa isa, bool q_f32,
                  int64_t first_row = 0, int64_t n_rows = -1) {
  const int64_t H = p.shape.heads, R = p.shape.kv_lora_rank, D = p.shape.dim();
  if (n_rows < 0) n_rows = int64_t(s.queries.size());
  Output out{std::vector<float>(size_t(n_rows * H * R), -7.0f),
             std::vector<float>(size_t(n_rows * H), -7.0f)};
  MlaBatch dense = p.batch(nullptr, nullptr, q_f32);  // (for the cache view and queries)
  const auto* q = static_cast<const uint8_t*>(dense.q) + first_row * H * D * (q_f32 ? 4 : 2);
  MlaOptions opt;
  opt.split_blocks = 4;
  mla_sparse(MlaSparseBatch{p.shape, dense.cache,
                            std::span(s.queries).subspan(size_t(first_row), size_t(n_rows)), q,
                            dense.q_dtype, out.o.data(), out.lse.data()},
             pool, opt, isa);
  return out;
}

// Rows beyond the problem's own (p.rows) need queries: the problem is made with enough rows.
Problem problem(DType cache, uint32_t seed) {
  // 20 one-query sequences (> kMlaSparseWave rows), contexts across block edges.
  std::vector<SeqSpec> specs;
  for (int64_t ctx : {1, 2, 63, 64, 65, 130, 300, 700, 1500, 97}) specs.push_back({ctx, 1});
  for (int64_t ctx : {5, 64, 128, 129, 640, 333, 1024, 77, 256, 900}) specs.push_back({ctx, 1});
  Problem p = make_problem(16, 512, 64, 0.07f, specs, seed);
  if (cache == DType::kF8E4M3) {
    vary_tile_scales(p);
    quantize_to_fp8(p);
  }
  p.cache_dtype = cache;
  return p;
}

TEST(MlaSparse, EveryLevelMatchesNaiveAttentionOverTheSelection) {
  ThreadPool pool(2);
  const std::vector<int64_t> sizes = {1,  2,   64, 65, 100, 257, 700, 1500, 50,  3,
                                      64, 128, 40, 1,  640, 333, 999, 60,   200, 900};
  for (DType cache : {DType::kBF16, DType::kF8E4M3}) {
    const Problem p = problem(cache, cache == DType::kBF16 ? 7 : 8);
    const Sparse s = select(p, sizes, 11);
    for (bool q_f32 : {false, true}) {
      std::vector<float> q = p.q32;
      if (!q_f32) {
        for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_to_f32(p.q16[i]);
      }
      const Attention want = naive_sparse(p, s, q);
      for (Isa isa : testing::isa_levels()) {
        const Output got = run_sparse(p, s, &pool, isa, q_f32);
        // The levels' bounds (mla_decode_levels_test.cpp): the BF16 kernel rounds P to BF16.
        const Tol tol = isa >= Isa::kAvx512Bf16 ? kFastTol : kRefTol;
        expect_close(got.o, got.lse, want, tol,
                     std::string(isa_name(isa)) + (cache == DType::kBF16 ? " bf16" : " fp8") +
                         " cache" + (q_f32 ? " f32 q" : " bf16 q"));
      }
    }
  }
}

TEST(MlaSparse, ARowGetsTheSameBitsAloneAsInABatch) {
  ThreadPool pool(2);
  const Problem p = problem(DType::kBF16, 9);
  const std::vector<int64_t> sizes(20, 300);
  const Sparse s = select(p, sizes, 12);
  const int64_t H = p.shape.heads, R = p.shape.kv_lora_rank;
  const Output all = run_sparse(p, s, &pool, active_isa(), true);
  for (int64_t i : {0, 7, 16, 19}) {
    const Output one = run_sparse(p, s, &pool, active_isa(), true, i, 1);
    for (int64_t j = 0; j < H * R; ++j) {
      ASSERT_TRUE(testing::same_bits(one.o[size_t(j)], all.o[size_t(i * H * R + j)])) << i;
    }
  }
}

}  // namespace
}  // namespace moeserve
