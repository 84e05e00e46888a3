// The fused row kernels the EP dispatch and combine use (kernels/convert.h) give, at every ISA
// level this CPU runs, exactly the bits of the two-step path they replace:
//   bf16_round_axpy_row(w, x)      == f32_to_bf16 then bf16_axpy_row (combine rows kept on rank)
//   fp8_1x128_to_bf16_row(q, s)    == fp8_1x128_to_f32_row then f32_to_bf16 (dispatch BF16 rows)
// on data with specials (NaN, infinities, subnormals, ties) and lengths that are not multiples
// of 16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../test_isa.h"
#include "core/dtype.h"
#include "kernels/convert.h"

namespace moeserve {
namespace {

std::vector<float> tricky(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            1e-40f,
                            -3e-39f,
                            1.00390625f /* tie: rounds to even */,
                            1.01171875f,
                            3.4e38f};
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    x[size_t(i)] = i % 7 == 3 ? specials[size_t(i / 7) % std::size(specials)] : normal(rng);
  }
  return x;
}

TEST(CombineKernels, RoundAxpyEqualsRoundingThenBf16Axpy) {
  for (int64_t n : {1, 9, 16, 33, 2048, 2055}) {
    const std::vector<float> x = tricky(n, uint32_t(n)), y0 = tricky(n, uint32_t(n + 100));
    for (float w : {0.125f, -0.7f, 1.3e-3f}) {
      // The two-step path, scalar: what the combine computed before for every row.
      std::vector<uint16_t> rounded(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) rounded[size_t(i)] = f32_to_bf16(x[size_t(i)]);
      std::vector<float> want = y0;
      bf16_axpy_row(w, rounded.data(), n, want.data(), Isa::kScalar);
      for (Isa isa : testing::isa_levels()) {
        std::vector<float> y = y0;
        y.push_back(9.0f);
        bf16_round_axpy_row(w, x.data(), n, y.data(), isa);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(testing::same_bits(y[size_t(i)], want[size_t(i)]))
              << isa_name(isa) << " n=" << n << " w=" << w << " i=" << i << ": " << y[size_t(i)]
              << " vs " << want[size_t(i)];
        }
        EXPECT_EQ(y[size_t(n)], 9.0f) << "wrote past the end";
      }
    }
  }
}

TEST(CombineKernels, Fp8ToBf16EqualsDequantizeThenRound) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> scale(1e-3f, 4.0f);
  for (int64_t n : {1, 15, 16, 17, 128, 200, 256, 2055, 7168}) {
    std::vector<uint8_t> q(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c) q[size_t(c)] = uint8_t(c < 256 ? c : rng());  // every byte
    std::vector<float> s(static_cast<size_t>((n + 127) / 128));
    for (float& v : s) v = scale(rng);
    s[0] = 3e-39f;  // a subnormal scale: products round below the normal range
    std::vector<float> f(static_cast<size_t>(n));
    fp8_1x128_to_f32_row(q.data(), s.data(), n, f.data(), Isa::kScalar);
    for (Isa isa : testing::isa_levels()) {
      std::vector<uint16_t> out(static_cast<size_t>(n + 1), 0xabcd);
      fp8_1x128_to_bf16_row(q.data(), s.data(), n, out.data(), isa);
      for (int64_t c = 0; c < n; ++c) {
        ASSERT_EQ(out[size_t(c)], f32_to_bf16(f[size_t(c)]))
            << isa_name(isa) << " n=" << n << " c=" << c << " byte " << int(q[size_t(c)]);
      }
      EXPECT_EQ(out[size_t(n)], 0xabcd) << "wrote past the end";
    }
  }
}

}  // namespace
}  // namespace moeserve
