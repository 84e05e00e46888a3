// Row conversions (kernels/convert.h) at every ISA level this CPU runs give exactly the scalar
// conversions of core/dtype.h, on random data with specials (every e4m3 byte, BF16 subnormals,
// infinities, NaNs, values that round to even) and lengths that are not multiples of 16.
#include "kernels/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../test_isa.h"
#include "core/dtype.h"
#include "kernels/gemm_bf16.h"

namespace moeserve {
namespace {

TEST(Convert, Fp8RowsMatchTheTableAtEveryLevel) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> scale(1e-3f, 4.0f);
  for (int64_t n : {1, 15, 16, 17, 128, 200, 256, 7168}) {
    std::vector<uint8_t> q(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c) q[size_t(c)] = uint8_t(c < 256 ? c : rng());  // every byte
    std::vector<float> s(static_cast<size_t>((n + 127) / 128));
    for (float& v : s) v = scale(rng);
    for (Isa isa : testing::isa_levels()) {
      std::vector<float> out(size_t(n), -7.0f);
      fp8_1x128_to_f32_row(q.data(), s.data(), n, out.data(), isa);
      for (int64_t c = 0; c < n; ++c) {
        float want = fp8e4m3_to_f32(q[size_t(c)]) * s[size_t(c / 128)];
        ASSERT_TRUE(testing::same_bits(out[size_t(c)], want))
            << isa_name(isa) << " n=" << n << " c=" << c << " byte " << int(q[size_t(c)]) << ": "
            << out[size_t(c)] << " vs " << want;
      }
    }
  }
}

std::vector<float> tricky_floats(int64_t n, uint32_t seed) {
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

TEST(Convert, Bf16RowsMatchTheScalarConversionsAtEveryLevel) {
  for (int64_t n : {1, 9, 16, 33, 2048, 2055}) {
    std::vector<float> x = tricky_floats(n, uint32_t(n));
    std::vector<uint16_t> want_b(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want_b[size_t(i)] = f32_to_bf16(x[size_t(i)]);
    for (Isa isa : testing::isa_levels()) {
      std::vector<uint16_t> b(static_cast<size_t>(n + 1), 0xabcd);
      f32_to_bf16_row_isa(x.data(), n, b.data(), isa);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(b[size_t(i)], want_b[size_t(i)]) << isa_name(isa) << " n=" << n << " i=" << i;
      }
      EXPECT_EQ(b[size_t(n)], 0xabcd) << "wrote past the end";

      std::vector<float> f(static_cast<size_t>(n + 1), 5.0f);
      bf16_to_f32_row(want_b.data(), n, f.data(), isa);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(testing::same_bits(f[size_t(i)], bf16_to_f32(want_b[size_t(i)])))
            << isa_name(isa) << " i=" << i;
      }
      EXPECT_EQ(f[size_t(n)], 5.0f);

      std::vector<float> y = tricky_floats(n + 1, 99), y_ref = y;
      const float w = 0.37f;
      bf16_axpy_row(w, want_b.data(), n, y.data(), isa);
      for (int64_t i = 0; i < n; ++i) {
        float p = w * bf16_to_f32(want_b[size_t(i)]);
        float want = y_ref[size_t(i)] + p;
        ASSERT_TRUE(testing::same_bits(y[size_t(i)], want))
            << isa_name(isa) << " i=" << i << " got " << y[size_t(i)] << " want " << want << " ref "
            << y_ref[size_t(i)] << " x " << bf16_to_f32(want_b[size_t(i)]);
      }
      EXPECT_TRUE(testing::same_bits(y[size_t(n)], y_ref[size_t(n)]));
    }
  }
  // The public row conversion of gemm_bf16.h is the dispatched one.
  std::vector<float> x = tricky_floats(100, 3);
  std::vector<uint16_t> a(100), b(100);
  f32_to_bf16_row(x.data(), 100, a.data());
  for (int i = 0; i < 100; ++i) b[size_t(i)] = f32_to_bf16(x[size_t(i)]);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace moeserve
