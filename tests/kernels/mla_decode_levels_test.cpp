// mla_decode at every ISA level this CPU runs (scalar = the reference, AVX2 and AVX-512F = the
// FP32 kernel, AVX-512 BF16 = the BF16 kernel) against a naive double-precision attention and
// against mla_decode_ref, on one matrix: batches of sequences of different lengths on shuffled
// block tables, contexts 1..300 around the 64-token block edges plus long ones that split over
// the KV length, decode and causal prefill chunks mixed, 1 and 16 heads, DeepSeek-V3's 512 + 64
// and small odd shapes, BF16 and F32 queries, o and lse; BF16, F32 and FP8 caches.
//
// Bounds, from each level's arithmetic (kernels/mla_decode.h):
//  - scalar, AVX2, AVX-512F: FP32 products of the exact cache values and the queries as given,
//    FP32 sums and softmax weights: held to the FP32 reference's own bound (kRefTol).
//  - AVX-512 BF16: P rounded to BF16 (kFastTol), or with F32 queries and split_p both carried
//    as hi + lo (kRefTol); a shape the BF16 kernel does not take runs the AVX-512F kernel there
//    (kRefTol).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../test_isa.h"
#include "kernels/mla_decode.h"
#include "mla_test_util.h"

namespace moeserve {
namespace {

using namespace mla_test;
using moeserve::testing::isa_levels;

struct ShapeCase {
  int64_t heads, rank, rope;
  float scale;
};

// Decodes around the block edges and a long context, plus prefill chunks starting mid-block,
// on a block edge, and a whole prompt.
const std::vector<SeqSpec> kMixed = {{1, 1},   {2, 1},    {63, 1}, {64, 1},  {65, 1},  {130, 1},
                                     {300, 1}, {200, 20}, {70, 6}, {64, 64}, {129, 3}, {1500, 1}};

std::string describe(Isa isa, const ShapeCase& c, bool q_f32, int64_t parts) {
  return std::string(isa_name(isa)) + " " + std::to_string(c.heads) + " heads " +
         std::to_string(c.rank) + "+" + std::to_string(c.rope) + (q_f32 ? " f32 q" : " bf16 q") +
         " parts " + std::to_string(parts);
}

bool bf16_kernel_takes(const ShapeCase& c) {
  return c.rank % 32 == 0 && c.rope % 2 == 0;
}

// The bound of a level for this shape and query type (see the file comment).
Tol level_tol(Isa isa, const ShapeCase& c, bool split_p) {
  if (isa < Isa::kAvx512Bf16 || !bf16_kernel_takes(c)) return kRefTol;
  return split_p ? kSplitTol : kFastTol;
}

void check_levels(const ShapeCase& c, const std::vector<SeqSpec>& specs, uint32_t seed) {
  ThreadPool pool(2);
  Problem p = make_problem(c.heads, c.rank, c.rope, c.scale, specs, seed);
  for (bool q_f32 : {false, true}) {
    // The queries as given: BF16 values, or the exact F32 ones.
    const Attention want = q_f32 ? naive(p, p.q32) : naive_bf16_q(p);
    Output ref{std::vector<float>(size_t(p.rows * c.heads * c.rank)),
               std::vector<float>(size_t(p.rows * c.heads))};
    mla_decode_ref(p.batch(ref.o.data(), ref.lse.data(), q_f32), &pool);
    expect_close(ref.o, ref.lse, want, kRefTol, "mla_decode_ref");
    const Attention ref_d{std::vector<double>(ref.o.begin(), ref.o.end()),
                          std::vector<double>(ref.lse.begin(), ref.lse.end())};
    for (Isa isa : isa_levels()) {
      // parts 0: one share per thread; 1: no split; 7: long sequences cut over the KV length.
      for (int64_t parts : {0, 1, 7}) {
        for (bool split_p : {false, true}) {
          if (split_p && !(q_f32 && isa >= Isa::kAvx512Bf16)) continue;  // BF16 level only
          MlaOptions opt{parts};
          opt.split_p = split_p;
          const Output got = run(p, &pool, opt, isa, q_f32);
          const Tol tol = level_tol(isa, c, split_p);
          const std::string what = describe(isa, c, q_f32, parts) + (split_p ? " split_p" : "");
          expect_close(got.o, got.lse, want, tol, what);
          // And against the FP32 reference itself: both within the bound of the exact answer.
          if (tol.o_max == kRefTol.o_max) {
            expect_close(got.o, got.lse, ref_d, kRefTol, what + " vs mla_decode_ref");
          }
        }
      }
    }
  }
}

TEST(MlaDecodeLevels, DeepSeekV3ShapeOneHead) {
  check_levels({1, 512, 64, 0.15f}, kMixed, 1001);
}

TEST(MlaDecodeLevels, DeepSeekV3Shape16Heads) {
  check_levels({16, 512, 64, 0.15f}, kMixed, 1002);
}

// kv_lora_rank 160 (a multiple of 32 but not of 64: column tails at every level), 3 heads
// (rows not a multiple of any vector width).
TEST(MlaDecodeLevels, SmallShapeOddHeads) {
  check_levels({3, 160, 16, 0.3f}, kMixed, 1003);
}

// kv_lora_rank 80 and an odd rope dim: the FP32 kernel takes it (rank % 16 == 0), the BF16
// kernel does not, so the BF16 level runs the AVX-512F kernel and is held to kRefTol.
TEST(MlaDecodeLevels, OddRopeShapeRunsTheFp32KernelAtEveryFastLevel) {
  check_levels({16, 80, 13, 0.25f}, kMixed, 1004);
}

// A shape no fast kernel takes (rank % 16 != 0) and an F32 cache: the reference at every level.
TEST(MlaDecodeLevels, UnsupportedShapesAndF32CacheRunTheReference) {
  check_levels({5, 24, 8, 0.3f}, {{1, 1}, {65, 1}, {200, 7}}, 1005);
  ThreadPool pool(2);
  Problem p = make_problem(16, 160, 16, 0.3f, {{1, 1}, {130, 1}, {90, 9}}, 1006);
  p.cache_dtype = DType::kF32;
  const Attention want = naive_bf16_q(p);
  for (Isa isa : isa_levels()) {
    const Output got = run(p, &pool, MlaOptions{3}, isa);
    expect_close(got.o, got.lse, want, kRefTol, std::string(isa_name(isa)) + " f32 cache");
  }
}

// Large logits (scale 6: lse ~140, weights spread over ~2^-200): the FP32 kernels' exp2 must
// neither overflow nor turn the masked or negligible weights into NaN. Bound as
// SplitPeakedSoftmaxMatchesFp32Reference (mla_decode_test.cpp): FP32 score error grows with
// the logits.
TEST(MlaDecodeLevels, PeakedSoftmax) {
  constexpr Tol kPeakedTol{1e-4, 1e-5, 5e-4};
  ThreadPool pool(2);
  Problem p = make_problem(16, 160, 16, 6.0f, {{300, 1}, {64, 1}, {1, 1}, {100, 30}}, 1007);
  const Attention want = naive(p, p.q32);
  for (Isa isa : isa_levels()) {
    if (isa >= Isa::kAvx512Bf16) continue;  // mla_decode_test.cpp covers it
    const Output got = run(p, &pool, MlaOptions{3}, isa, /*q_f32=*/true);
    expect_close(got.o, got.lse, want, kPeakedTol, std::string(isa_name(isa)) + " peaked");
  }
}

// An FP8 cache (FlashMLA's format) at every level: each level dequantizes exactly (to BF16
// scratch at the BF16 level, to F32 below it, through kv_token_load in the reference), so it
// gives the bits it gives on a BF16 cache holding the dequantized values, and is held to its
// own bound against the naive attention over them. Shapes: V3 (the BF16 kernel at the BF16
// level), 128 + 16 with 3 heads, and an odd rope dim (the AVX-512F kernel at the BF16 level).
TEST(MlaDecodeLevels, Fp8CacheGivesTheBf16CachesBits) {
  ThreadPool pool(2);
  uint32_t seed = 1010;
  for (const ShapeCase& c :
       {ShapeCase{16, 512, 64, 0.15f}, ShapeCase{3, 128, 16, 0.3f}, ShapeCase{4, 256, 13, 0.25f}}) {
    Problem p = make_problem(c.heads, c.rank, c.rope, c.scale, kMixed, seed++);
    vary_tile_scales(p);
    quantize_to_fp8(p);
    for (bool q_f32 : {false, true}) {
      const Attention want = q_f32 ? naive(p, p.q32) : naive_bf16_q(p);
      for (Isa isa : isa_levels()) {
        for (int64_t parts : {0, 7}) {
          const std::string what = describe(isa, c, q_f32, parts);
          p.cache_dtype = DType::kF8E4M3;
          const Output fp8 = run(p, &pool, MlaOptions{parts}, isa, q_f32);
          expect_close(fp8.o, fp8.lse, want, level_tol(isa, c, false), what + " fp8 cache");
          p.cache_dtype = DType::kBF16;
          const Output bf16 = run(p, &pool, MlaOptions{parts}, isa, q_f32);
          EXPECT_EQ(fp8.o, bf16.o) << what;
          EXPECT_EQ(fp8.lse, bf16.lse) << what;
        }
      }
    }
  }
}

// Fixed splits at every level: a sequence's bits do not depend on the rest of the batch.
TEST(MlaDecodeLevels, FixedSplitsMakeEachSequenceIndependentOfTheBatch) {
  ThreadPool pool(2);
  const std::vector<SeqSpec> specs = {{700, 1}, {65, 1}, {300, 40}};
  Problem p = make_problem(16, 512, 64, 0.15f, specs, 1008);
  const int64_t H = p.shape.heads, R = p.shape.kv_lora_rank, D = p.shape.dim();
  MlaOptions fixed;
  fixed.split_blocks = 2;
  for (Isa isa : isa_levels()) {
    const Output all = run(p, &pool, fixed, isa, /*q_f32=*/true);
    int64_t row = 0;
    for (size_t i = 0; i < p.seqs.size(); ++i) {
      const int64_t nq = p.seqs[i].n_queries;
      std::vector<float> o(size_t(nq * H * R)), lse(size_t(nq * H));
      MlaBatch one = p.batch(o.data(), lse.data(), /*q_f32=*/true);
      one.seqs = std::span<const MlaSequence>(&p.seqs[i], 1);
      one.q = p.q32.data() + row * H * D;
      mla_decode(one, &pool, fixed, isa);
      EXPECT_TRUE(std::equal(o.begin(), o.end(), all.o.begin() + row * H * R))
          << isa_name(isa) << " sequence " << i;
      EXPECT_TRUE(std::equal(lse.begin(), lse.end(), all.lse.begin() + row * H))
          << isa_name(isa) << " sequence " << i;
      row += nq;
    }
  }
}

}  // namespace
}  // namespace moeserve
