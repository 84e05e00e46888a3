// RopeTable::apply_fast (kernels/rope.h) gives apply()'s bits at every ISA level: plain and YaRN
// tables (attention factor != 1), rotary dims that are not multiples of 8 or 16, one or many
// rows with a stride (the model's q_pe of every head), positions up to DeepSeek-V3's context;
// values between the rows are left alone.
#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "../test_isa.h"

namespace moeserve {
namespace {

RopeParams yarn_params(int64_t dim) {  // DeepSeek-V3's rope_scaling with mscale_all_dim unset
  RopeParams p;
  p.dim = dim;
  p.yarn = true;
  p.factor = 40.0;
  p.original_max_position_embeddings = 4096;
  p.mscale = 1.0;
  p.mscale_all_dim = 0.0;
  return p;
}

TEST(Rope, FastRotationHasTheReferenceBitsAtEveryLevel) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t dim : {2, 6, 8, 14, 16, 18, 30, 64, 66, 128}) {
    RopeParams plain;
    plain.dim = dim;
    for (const RopeParams& params : {plain, yarn_params(dim)}) {
      const RopeTable table(params);
      if (params.yarn) {
        ASSERT_NE(table.attention_factor(), 1.0f);
      }
      for (int64_t n_rows : {1, 3, 16}) {
        const int64_t ld = dim + 7;  // rows apart, with values in between that must not move
        std::vector<float> x(size_t(n_rows * ld));
        for (float& v : x) v = normal(rng);
        for (int64_t pos : {0, 1, 17, 255, 4095, 4096, 65537, 163839}) {
          std::vector<float> want = x;
          table.apply(want.data(), n_rows, ld, pos);
          for (Isa isa : testing::isa_levels()) {
            std::vector<float> got = x;
            table.apply_fast(got.data(), n_rows, ld, pos, isa);
            for (size_t k = 0; k < got.size(); ++k) {
              ASSERT_TRUE(testing::same_bits(got[k], want[k]))
                  << isa_name(isa) << " dim=" << dim << " yarn=" << params.yarn
                  << " rows=" << n_rows << " pos=" << pos << " k=" << k << ": " << got[k] << " vs "
                  << want[k];
            }
          }
        }
      }
    }
  }
}

TEST(Rope, FastRotationRotates) {  // the reference itself: a pair keeps its length times the factor
  RopeParams p = yarn_params(64);
  const RopeTable table(p);
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 5) - 1.5f;
  std::vector<float> y = x;
  table.apply_fast(y.data(), 1, 64, 1234);
  const float f = table.attention_factor();
  for (size_t i = 0; i < x.size(); i += 2) {
    const float before = std::hypot(x[i], x[i + 1]) * f, after = std::hypot(y[i], y[i + 1]);
    EXPECT_NEAR(after, before, 1e-5f * before + 1e-6f) << "pair " << i / 2;
  }
  EXPECT_NE(y, x);
}

}  // namespace
}  // namespace moeserve
