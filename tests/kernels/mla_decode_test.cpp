// mla_decode (paged absorbed MLA, decode and causal prefill chunks) against a naive
// double-precision attention written here from the formulas, on random data (never zeros):
// context lengths around the 64-token block edges and past 1000, shuffled block tables, slots
// past each sequence's end filled with NaN bit patterns, heads 1..128, DeepSeek-V3's 512 + 64 and
// a small 160 + 16 shape, KV splits forced at many cut points; F32 queries (carried as BF16
// hi + lo) against attention on the exact F32 queries. These run the CPU's best level (the BF16
// kernel here); mla_decode_levels_test.cpp holds every level to its own bound.
#include "kernels/mla_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "mla_test_util.h"

namespace moeserve {
namespace {

using namespace mla_test;

const std::vector<SeqSpec> kDecodeLens = {{1, 1}, {63, 1}, {64, 1}, {65, 1}, {1100, 1}, {130, 1}};

TEST(MlaDecode, ReferenceMatchesNaiveDouble) {
  for (int64_t heads : {1, 16}) {
    Problem p = make_problem(heads, 512, 64, 0.15f, kDecodeLens, 11);
    std::vector<float> o(size_t(p.rows * heads * 512)), lse(size_t(p.rows * heads));
    ThreadPool pool(2);
    mla_decode_ref(p.batch(o.data(), lse.data()), &pool);
    expect_close(o, lse, naive_bf16_q(p), kRefTol, "ref heads " + std::to_string(heads));
  }
}

TEST(MlaDecode, DeepSeekV3ShapeMatchesNaive) {
  ThreadPool pool(2);
  for (int64_t heads : {1, 16, 128}) {
    Problem p = make_problem(heads, 512, 64, 0.15f, kDecodeLens, 100 + uint32_t(heads));
    const Attention want = naive_bf16_q(p);
    const Output got = run(p, &pool, {}, cpu_isa());
    expect_close(got.o, got.lse, want, kFastTol, "V3 heads " + std::to_string(heads));
  }
}

TEST(MlaDecode, SmallOddShapeMatchesNaive) {
  ThreadPool pool(2);
  const std::vector<SeqSpec> lens = {{1, 1},  {2, 1},   {63, 1},  {64, 1},
                                     {65, 1}, {129, 1}, {1000, 1}};
  for (int64_t heads : {1, 3, 16, 20}) {
    Problem p = make_problem(heads, 160, 16, 0.3f, lens, 200 + uint32_t(heads));
    const Attention want = naive_bf16_q(p);
    const Output got = run(p, &pool, {}, cpu_isa());
    expect_close(got.o, got.lse, want, kFastTol, "160+16 heads " + std::to_string(heads));
  }
}

// The shape of the v3 HF fixture (kv_lora_rank 160, rope 32, 4 heads), decode and prefill.
TEST(MlaDecode, FixtureShapeMatchesNaive) {
  ThreadPool pool(2);
  const std::vector<SeqSpec> specs = {{1, 1}, {70, 70}, {94, 1}, {10, 10}};
  Problem p = make_problem(4, 160, 32, 0.11f, specs, 77);
  const Attention want = naive_bf16_q(p);
  const Output got = run(p, &pool, {}, cpu_isa());
  expect_close(got.o, got.lse, want, kFastTol, "160+32 heads 4");
}

TEST(MlaDecode, SplitAndUnsplitAgree) {
  ThreadPool pool1(1), pool2(2);
  for (int64_t heads : {16, 128}) {
    Problem p = make_problem(heads, 512, 64, 0.15f, kDecodeLens, 300 + uint32_t(heads));
    const Attention want = naive_bf16_q(p);
    const Output whole = run(p, &pool1, MlaOptions{1}, cpu_isa());
    expect_close(whole.o, whole.lse, want, kFastTol, "unsplit");
    for (int64_t parts : {2, 3, 7, 16, 40}) {
      for (ThreadPool* pool : {&pool1, &pool2}) {
        const std::string what =
            "parts " + std::to_string(parts) + " threads " + std::to_string(pool->size());
        const Output split = run(p, pool, MlaOptions{parts}, cpu_isa());
        expect_close(split.o, split.lse, want, kFastTol, what);
        // Split and unsplit differ only by where the BF16 rounding of P happens.
        Attention whole_d{std::vector<double>(whole.o.begin(), whole.o.end()),
                          std::vector<double>(whole.lse.begin(), whole.lse.end())};
        expect_close(split.o, split.lse, whole_d, kFastTol, what + " vs unsplit");
      }
    }
  }
}

TEST(MlaDecode, LongContextSplitsOverManyParts) {
  // One long sequence cut into many pieces, and batches where short sequences share parts.
  ThreadPool pool(2);
  Problem p = make_problem(16, 512, 64, 0.15f, {{3000, 1}, {5, 1}, {64, 1}}, 41);
  const Attention want = naive_bf16_q(p);
  for (int64_t parts : {1, 2, 5, 33}) {
    const Output got = run(p, &pool, MlaOptions{parts}, cpu_isa());
    expect_close(got.o, got.lse, want, kFastTol, "parts " + std::to_string(parts));
  }
}

// `opt` at each part count and pool gives base's bits.
void expect_bits_at_every_part(const Problem& p, const MlaOptions& opt, const Output& base,
                               std::initializer_list<int64_t> parts,
                               std::initializer_list<ThreadPool*> pools) {
  for (int64_t n : parts) {
    for (ThreadPool* pool : pools) {
      MlaOptions o = opt;
      o.parts = n;
      const Output got = run(p, pool, o, cpu_isa());
      EXPECT_EQ(got.o, base.o) << "parts " << n << " threads " << pool->size();
      EXPECT_EQ(got.lse, base.lse) << "parts " << n << " threads " << pool->size();
    }
  }
}

// Fixed splits: each sequence's bits depend only on the sequence, so one call over a whole step
// gives every request what it gets alone, at any part count and thread count.
TEST(MlaDecode, FixedSplitsMakeEachSequenceIndependentOfTheBatch) {
  ThreadPool pool1(1), pool2(2);
  std::vector<SeqSpec> lens = kDecodeLens;
  lens.push_back({300, 40});  // a prefill chunk among the decodes
  Problem p = make_problem(16, 512, 64, 0.15f, lens, 77);
  const Attention want = naive_bf16_q(p);
  const int64_t H = p.shape.heads, R = p.shape.kv_lora_rank, D = p.shape.dim();
  MlaOptions fixed;
  fixed.split_blocks = 2;
  const Output base = run(p, &pool2, fixed, cpu_isa());
  expect_close(base.o, base.lse, want, kFastTol, "fixed splits");
  expect_bits_at_every_part(p, fixed, base, {1, 2, 5}, {&pool1, &pool2});
  int64_t row = 0;
  for (size_t i = 0; i < p.seqs.size(); ++i) {
    const int64_t nq = p.seqs[i].n_queries;
    std::vector<float> o(size_t(nq * H * R)), lse(size_t(nq * H));
    MlaBatch one = p.batch(o.data(), lse.data());
    one.seqs = std::span<const MlaSequence>(&p.seqs[i], 1);
    one.q = p.q16.data() + row * H * D;
    mla_decode(one, &pool2, fixed, cpu_isa());
    EXPECT_TRUE(std::equal(o.begin(), o.end(), base.o.begin() + row * H * R)) << "sequence " << i;
    EXPECT_TRUE(std::equal(lse.begin(), lse.end(), base.lse.begin() + row * H)) << "sequence " << i;
    row += nq;
  }
}

// A decode step of few sequences at short contexts (one fixed-split piece each) is spread over
// the parts by heads as well (16-row tiles of a query's 128 heads): every row keeps the bits it
// has in one piece, at any part count, and the attention is the naive one.
TEST(MlaDecode, HeadSplitDecodeKeepsEveryRowsBits) {
  ThreadPool pool1(1), pool2(2);
  Problem p = make_problem(128, 512, 64, 0.15f, {{200, 1}, {100, 1}, {1, 1}}, 78);
  MlaOptions fixed;
  fixed.split_blocks = 4;
  fixed.parts = 1;  // one part: no head split
  const Output base = run(p, &pool1, fixed, cpu_isa());
  expect_close(base.o, base.lse, naive_bf16_q(p), kFastTol, "one part");
  // 3 pieces: head ranges of 128, 64, 48, 32 and 16 rows.
  expect_bits_at_every_part(p, fixed, base, {2, 4, 8, 16, 24}, {&pool1, &pool2});
}

// F32 queries are not rounded to BF16: the kernel carries them as hi + lo, so its answer is
// attention on the exact F32 queries, within the error of P's BF16 rounding (kFastTol).
TEST(MlaDecode, F32QueriesAreNotRoundedToBf16) {
  ThreadPool pool(2);
  Problem p = make_problem(16, 512, 64, 0.15f, kDecodeLens, 51);
  const Output got = run(p, &pool, {}, cpu_isa(), /*q_f32=*/true);
  expect_close(got.o, got.lse, naive(p, p.q32), kFastTol, "F32 q");
}

// With split_p as well, the fast level matches the FP32 reference's own tolerance, on every
// shape the other tests use: decode and prefill chunks, V3 and small shapes, forced KV splits.
TEST(MlaDecode, SplitQueriesAndWeightsMatchFp32Reference) {
  ThreadPool pool(2);
  struct Case {
    int64_t heads, rank, rope;
    float scale;
    std::vector<SeqSpec> specs;
  };
  const std::vector<Case> cases = {
      {16, 512, 64, 0.15f, kDecodeLens},
      {128, 512, 64, 0.15f, {{300, 1}, {65, 65}, {150, 12}}},
      {4, 160, 32, 0.11f, {{1, 1}, {70, 70}, {94, 1}, {10, 10}}},  // the v3 HF fixture's shape
      {3, 160, 16, 0.3f, {{1000, 1}, {129, 1}, {230, 166}}},
  };
  uint32_t seed = 600;
  for (const Case& c : cases) {
    Problem p = make_problem(c.heads, c.rank, c.rope, c.scale, c.specs, seed++);
    const Attention want = naive(p, p.q32);
    for (int64_t parts : {0, 1, 7}) {
      MlaOptions opt{parts};
      opt.split_p = true;
      const Output got = run(p, &pool, opt, cpu_isa(), /*q_f32=*/true);
      expect_close(got.o, got.lse, want, kSplitTol,
                   std::to_string(c.heads) + " heads " + std::to_string(c.rank) + "+" +
                       std::to_string(c.rope) + " parts " + std::to_string(parts));
    }
  }
}

// Logits in the hundreds (lse ~140): q = hi + lo keeps ~16 significant bits, so a score that
// large moves by ~1e-4 (the FP32 reference's own error here is ~7e-5 in lse); both are held to
// a bound scaled to the logits (the BF16 kernel's o error on this problem is 8e-4).
TEST(MlaDecode, SplitPeakedSoftmaxMatchesFp32Reference) {
  ThreadPool pool(2);
  constexpr Tol kPeakedTol{1e-4, 1e-5, 5e-4};
  Problem p = make_problem(16, 160, 16, 6.0f, {{300, 1}, {64, 1}, {1, 1}}, 61);
  const Attention want = naive(p, p.q32);
  std::vector<float> o(size_t(p.rows * 16 * 160)), lse(size_t(p.rows * 16));
  mla_decode_ref(p.batch(o.data(), lse.data(), /*q_f32=*/true), &pool);
  expect_close(o, lse, want, kPeakedTol, "FP32 reference, peaked");
  MlaOptions opt{3};
  opt.split_p = true;
  const Output got = run(p, &pool, opt, cpu_isa(), /*q_f32=*/true);
  expect_close(got.o, got.lse, want, kPeakedTol, "split, peaked");
}

// The split tolerance is tight enough to tell: rounding only the queries to BF16 (exact
// attention otherwise) misses it.
TEST(MlaDecode, Bf16QueriesFailTheSplitTolerance) {
  Problem p = make_problem(4, 160, 32, 0.11f, {{94, 1}, {70, 70}}, 602);
  const Attention exact = naive(p, p.q32), rounded = naive_bf16_q(p);
  double o_max = 0, lse_max = 0;
  for (size_t i = 0; i < exact.o.size(); ++i)
    o_max = std::max(o_max, std::fabs(exact.o[i] - rounded.o[i]));
  for (size_t i = 0; i < exact.lse.size(); ++i) {
    lse_max = std::max(lse_max, std::fabs(exact.lse[i] - rounded.lse[i]));
  }
  EXPECT_GT(o_max, 10 * kSplitTol.o_max);
  EXPECT_GT(lse_max, 10 * kSplitTol.lse_max);
}

TEST(MlaDecode, PeakedSoftmaxIsStable) {
  // Logits spread over hundreds: exp must neither overflow nor lose the winning tokens.
  ThreadPool pool(2);
  Problem p = make_problem(16, 160, 16, 6.0f, {{300, 1}, {64, 1}, {1, 1}}, 61);
  const Output got = run(p, &pool, MlaOptions{3}, cpu_isa());
  expect_close(got.o, got.lse, naive_bf16_q(p), kFastTol, "peaked");
}

TEST(MlaDecode, EveryIsaLevelAndF32Cache) {
  ThreadPool pool(2);
  Problem p = make_problem(3, 160, 16, 0.3f, {{1, 1}, {65, 1}, {200, 1}}, 71);
  const Attention want = naive_bf16_q(p);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx}) {
    if (!isa_at_most(isa, cpu_isa())) continue;
    for (DType dt : {DType::kBF16, DType::kF32}) {
      p.cache_dtype = dt;
      const Output got = run(p, &pool, MlaOptions{2}, isa);
      expect_close(got.o, got.lse, want, kFastTol,
                   std::string(isa_name(isa)) + (dt == DType::kF32 ? " f32 cache" : " bf16 cache"));
    }
  }
}

// The KV cache is block-major (every layer's 64 tokens of a block together), so a layer's pool
// has a block stride of n_layers * 64 tokens: every level must give the same bits as over a
// compact pool, and read nothing between the blocks (0xff bytes here: NaN in every format).
TEST(MlaDecode, BlockStrideGivesTheCompactPoolsBits) {
  ThreadPool pool(2);
  for (const int64_t rank : {160, 128}) {  // 128: an FP8 cache too (whole scale tiles)
    Problem p = make_problem(3, rank, 16, 0.3f, {{1, 1}, {65, 1}, {200, 2}}, 72);
    std::vector<DType> dtypes = {DType::kBF16, DType::kF32};
    if (rank % kKvFp8Tile == 0) {
      vary_tile_scales(p);
      quantize_to_fp8(p);
      dtypes.push_back(DType::kF8E4M3);
    }
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx}) {
      if (!isa_at_most(isa, cpu_isa())) continue;
      for (DType dt : dtypes) {
        p.cache_dtype = dt;
        MlaOptions opt{2};
        if (isa < Isa::kAvx512Bf16) opt.split_p = false;
        const Output want = run(p, &pool, opt, isa);
        Output got{std::vector<float>(want.o.size(), -7.0f), std::vector<float>(want.lse.size())};
        MlaBatch b = p.batch(got.o.data(), got.lse.data());
        const int64_t block = kMlaBlockTokens * b.cache.token.bytes(), stride = 3 * block;
        std::vector<uint8_t> strided(size_t(p.num_blocks * stride), 0xff);
        const uint8_t* compact = static_cast<const uint8_t*>(b.cache.blocks);
        for (int64_t k = 0; k < p.num_blocks; ++k) {
          std::copy_n(compact + k * block, block, &strided[size_t(k * stride + block)]);
        }
        b.cache.blocks = &strided[size_t(block)];
        b.cache.block_stride = stride;
        mla_decode(b, &pool, opt, isa);
        const std::string what =
            std::string(isa_name(isa)) + " " + dtype_name(dt) + " rank " + std::to_string(rank);
        EXPECT_EQ(got.o, want.o) << what;
        EXPECT_EQ(got.lse, want.lse) << what;
      }
    }
  }
}

// An FP8 cache (FlashMLA's format) at the CPU's best level, V3's shape, decode and prefill:
// attention over the dequantized values within the level's bound, and the very bits of a BF16
// cache holding those values (the kernel dequantizes exactly).
TEST(MlaDecode, Fp8CacheGivesTheBf16CachesBits) {
  ThreadPool pool(2);
  std::vector<SeqSpec> specs = kDecodeLens;
  specs.push_back({150, 12});
  specs.push_back({65, 65});
  for (int64_t heads : {16, 128}) {
    Problem p = make_problem(heads, 512, 64, 0.15f, specs, 700 + uint32_t(heads));
    vary_tile_scales(p);
    quantize_to_fp8(p);
    for (const bool q_f32 : {false, true}) {
      p.cache_dtype = DType::kF8E4M3;
      const Output fp8 = run(p, &pool, {}, cpu_isa(), q_f32);
      p.cache_dtype = DType::kBF16;
      const Output bf16 = run(p, &pool, {}, cpu_isa(), q_f32);
      const std::string what = "heads " + std::to_string(heads) + (q_f32 ? " f32 q" : " bf16 q");
      expect_close(fp8.o, fp8.lse, q_f32 ? naive(p, p.q32) : naive_bf16_q(p), kFastTol, what);
      EXPECT_EQ(fp8.o, bf16.o) << what;
      EXPECT_EQ(fp8.lse, bf16.lse) << what;
    }
  }
}

// What the FP8 format itself costs attention, beside BF16's: F32 latents (tiles of different
// scales) stored in each format and read back, naive double attention over each against the
// F32 values (V3 shape, 16 heads, decode up to 1,100 tokens, |v| <= 2). Measured: o within
// 0.096 and lse within 0.10 for FP8, 15x and 18x BF16's 6.3e-3 and 5.7e-3 (e4m3 keeps 3
// mantissa bits, BF16 7); held to twice that, and to at least 8x BF16's (a cache that did not
// quantize fails).
TEST(MlaDecode, Fp8FormatCostsAttentionMoreThanBf16) {
  Problem p = make_problem(16, 512, 64, 0.15f, kDecodeLens, 730);
  std::mt19937 rng(731);
  const int64_t D = p.shape.dim();
  for (const int64_t slot : written_slots(p)) {
    for (int64_t d = 0; d < D; ++d) p.pool32[size_t(slot * D + d)] = nonzero_uniform(rng);
  }
  vary_tile_scales(p);
  const Attention exact = naive_bf16_q(p);
  Problem bf16 = p, fp8 = p;
  for (const int64_t slot : written_slots(bf16)) {
    for (int64_t d = 0; d < D; ++d) {
      float& v = bf16.pool32[size_t(slot * D + d)];
      v = bf16_to_f32(f32_to_bf16(v));
    }
  }
  quantize_to_fp8(fp8);
  auto max_errors = [&](const Attention& got) {
    double o = 0, lse = 0;
    for (size_t i = 0; i < got.o.size(); ++i) o = std::max(o, std::fabs(got.o[i] - exact.o[i]));
    for (size_t i = 0; i < got.lse.size(); ++i) {
      lse = std::max(lse, std::fabs(got.lse[i] - exact.lse[i]));
    }
    return std::pair<double, double>{o, lse};
  };
  const auto [o16, lse16] = max_errors(naive_bf16_q(bf16));
  const auto [o8, lse8] = max_errors(naive_bf16_q(fp8));
  std::printf("[ format cost ] o: fp8 %.2e bf16 %.2e; lse: fp8 %.2e bf16 %.2e\n", o8, o16, lse8,
              lse16);
  EXPECT_LE(o8, 0.2);
  EXPECT_LE(lse8, 0.2);
  EXPECT_GE(o8, 8 * o16);
  EXPECT_GE(lse8, 8 * lse16);
}

TEST(MlaDecode, LseMayBeNull) {
  ThreadPool pool(2);
  Problem p = make_problem(16, 512, 64, 0.15f, {{700, 1}, {3, 1}}, 81);
  std::vector<float> o(size_t(p.rows * 16 * 512), -7.0f);
  mla_decode(p.batch(o.data(), nullptr), &pool, MlaOptions{3});
  const Output with = run(p, &pool, MlaOptions{3}, active_isa());
  EXPECT_EQ(o, with.o);
}

TEST(MlaPrefill, CausalChunksMatchNaive) {
  // Prefill chunks (several queries per sequence, causal inside the chunk) mixed with decodes:
  // a whole prompt, chunks starting mid-block and on a block edge, a single-token chunk.
  ThreadPool pool(2);
  const std::vector<SeqSpec> specs = {{1, 1}, {64, 64}, {100, 37}, {230, 166}, {129, 1}, {70, 6}};
  for (int64_t heads : {1, 16, 20}) {
    Problem p = make_problem(heads, 160, 16, 0.3f, specs, 400 + uint32_t(heads));
    const Attention want = naive_bf16_q(p);
    for (int64_t parts : {0, 1, 7}) {
      const Output got = run(p, &pool, MlaOptions{parts}, cpu_isa());
      expect_close(got.o, got.lse, want, kFastTol,
                   "prefill heads " + std::to_string(heads) + " parts " + std::to_string(parts));
    }
  }
}

TEST(MlaPrefill, DeepSeekV3ShapeMatchesNaive) {
  ThreadPool pool(2);
  for (int64_t heads : {16, 128}) {
    const std::vector<SeqSpec> specs = {{150, 12}, {65, 65}, {300, 1}};
    Problem p = make_problem(heads, 512, 64, 0.15f, specs, 500 + uint32_t(heads));
    const Output got = run(p, &pool, {}, cpu_isa());
    expect_close(got.o, got.lse, naive_bf16_q(p), kFastTol,
                 "V3 prefill heads " + std::to_string(heads));
  }
}

TEST(MlaPrefill, ReferenceMatchesNaiveDouble) {
  Problem p = make_problem(4, 160, 16, 0.3f, {{100, 37}, {64, 64}}, 91);
  std::vector<float> o(size_t(p.rows * 4 * 160)), lse(size_t(p.rows * 4));
  mla_decode_ref(p.batch(o.data(), lse.data()));
  expect_close(o, lse, naive_bf16_q(p), kRefTol, "prefill ref");
}

// With fixed splits a query row's bits do not depend on the other rows of its call: a prompt
// run as one chunk, as chunks of other sizes (shifting which queries share a group, and where
// each group's diagonal tile ends) and one query at a time gives every row the same o and lse.
// This is what lets the model's chunked prefill equal the whole prompt.
TEST(MlaPrefill, FixedSplitsMakeEachRowIndependentOfItsChunk) {
  ThreadPool pool(2);
  constexpr int64_t kLen = 300;
  for (int64_t heads : {16, 5}) {
    Problem p = make_problem(heads, 512, 64, 0.15f, {{kLen, kLen}}, 610 + uint32_t(heads));
    const int64_t H = heads, R = p.shape.kv_lora_rank, D = p.shape.dim();
    for (const bool q_f32 : {true, false}) {
      MlaOptions fixed;
      fixed.split_blocks = 2;
      const Output whole = run(p, &pool, fixed, cpu_isa(), q_f32);
      if (q_f32) expect_close(whole.o, whole.lse, naive(p, p.q32), kFastTol, "whole prompt");
      for (const int64_t chunk : {1, 7, 64, 129}) {
        std::vector<float> o(whole.o.size()), lse(whole.lse.size());
        for (int64_t q0 = 0; q0 < kLen; q0 += chunk) {
          const int64_t n = std::min(chunk, kLen - q0);
          const MlaSequence seq{p.tables[0], q0 + n, n};
          MlaBatch b = p.batch(o.data() + q0 * H * R, lse.data() + q0 * H, q_f32);
          b.seqs = std::span<const MlaSequence>(&seq, 1);
          b.q = q_f32 ? static_cast<const void*>(p.q32.data() + q0 * H * D)
                      : static_cast<const void*>(p.q16.data() + q0 * H * D);
          mla_decode(b, &pool, fixed, cpu_isa());
        }
        EXPECT_EQ(o, whole.o) << "heads " << heads << " chunk " << chunk << " f32 q " << q_f32;
        EXPECT_EQ(lse, whole.lse) << "heads " << heads << " chunk " << chunk << " f32 q " << q_f32;
      }
    }
  }
}

// MlaShape::q_zero_dims (the MHA form of prefill: queries [0 | q_nope | q_pe] over per-head
// rows [V | K]): skipping the score products of the queries' zero leading dims gives the bits of
// the full products, at every level (the ones that do not skip compute the same), for BF16 and
// F32 queries, decode and prefill rows, 1 and 16 heads, with V's width 128 (whole AMX steps)
// and 32. A kernel that skipped more than the zero dims, or skipped nonzero ones, fails.
TEST(MlaDecode, ZeroLeadingQueryDimsSkippedGiveTheSameBits) {
  ThreadPool pool(2);
  for (const auto& [heads, rank, rope] :
       {std::tuple<int64_t, int64_t, int64_t>{16, 128, 192}, {1, 128, 192}, {4, 32, 48}}) {
    Problem p = make_problem(heads, rank, rope, 0.1f, {{300, 300}, {130, 1}, {70, 5}},
                             700 + uint32_t(heads + rank));
    const int64_t D = p.shape.dim();
    for (int64_t r = 0; r < p.rows * heads; ++r) {
      std::fill_n(&p.q32[size_t(r * D)], rank, 0.0f);
      std::fill_n(&p.q16[size_t(r * D)], rank, uint16_t(0));
    }
    for (const Isa isa : {cpu_isa(), Isa::kAvx512, Isa::kScalar}) {
      if (!isa_at_most(isa, cpu_isa())) continue;
      for (const bool q_f32 : {true, false}) {
        MlaOptions fixed;
        fixed.split_blocks = 2;
        const Output full = run(p, &pool, fixed, isa, q_f32);
        Problem skip = p;
        skip.shape.q_zero_dims = rank;
        const Output got = run(skip, &pool, fixed, isa, q_f32);
        EXPECT_EQ(got.o, full.o) << heads << " heads, rank " << rank << ", isa " << int(isa);
        EXPECT_EQ(got.lse, full.lse) << heads << " heads, rank " << rank << ", isa " << int(isa);
        if (q_f32) expect_close(got.o, got.lse, naive(p, p.q32), kFastTol, "zero dims skipped");
      }
    }
  }
}

TEST(MlaDecode, EmptyBatchAndZeroQuerySequences) {
  ThreadPool pool(2);
  Problem p = make_problem(16, 160, 16, 0.3f, {{50, 0}, {70, 1}, {10, 0}}, 95);
  ASSERT_EQ(p.rows, 1);
  const Output got = run(p, &pool, MlaOptions{4}, cpu_isa());
  expect_close(got.o, got.lse, naive_bf16_q(p), kFastTol, "zero-query sequences");
  MlaBatch empty = p.batch(nullptr, nullptr);
  empty.seqs = {};
  mla_decode(empty, &pool);  // nothing to do, nothing touched
}

}  // namespace
}  // namespace moeserve
