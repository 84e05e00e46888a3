// attend_f32 (kernels/attend_f32.h): every level against a double-precision sum, within the F32
// summation bound (d + heads roundings of the magnitude sum), on shapes off the vector widths.
#include "kernels/attend_f32.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "../test_isa.h"

namespace moeserve {
namespace {

std::vector<float> random_f32(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(AttendF32, DotAndAxpyRowsWithinTheSummationBound) {
  std::mt19937 rng(1);
  for (int64_t d : {512, 128, 37}) {
    for (int64_t n : {1, 3, 4, 9, 130}) {
      const int64_t ld = d + 5;
      const std::vector<float> q = random_f32(size_t(d), rng), p = random_f32(size_t(n), rng);
      const std::vector<float> rows = random_f32(size_t(n * ld), rng);
      const std::vector<float> base = random_f32(size_t(d), rng);
      for (Isa isa : testing::isa_levels()) {
        std::vector<float> dots(static_cast<size_t>(n)), acc = base;
        dot_rows_f32(q.data(), rows.data(), n, d, ld, dots.data(), isa);
        axpy_rows_f32(p.data(), rows.data(), n, d, ld, acc.data(), isa);
        for (int64_t j = 0; j < n; ++j) {
          double exact = 0, mag = 0;
          for (int64_t k = 0; k < d; ++k) {
            exact += double(q[size_t(k)]) * rows[size_t(j * ld + k)];
            mag += std::fabs(double(q[size_t(k)]) * rows[size_t(j * ld + k)]);
          }
          ASSERT_LE(std::fabs(dots[size_t(j)] - exact), d * std::ldexp(mag, -24))
              << isa_name(isa) << " d " << d << " n " << n << " row " << j;
        }
        for (int64_t k = 0; k < d; ++k) {
          double exact = base[size_t(k)], mag = std::fabs(base[size_t(k)]);
          for (int64_t j = 0; j < n; ++j) {
            exact += double(p[size_t(j)]) * rows[size_t(j * ld + k)];
            mag += std::fabs(double(p[size_t(j)]) * rows[size_t(j * ld + k)]);
          }
          ASSERT_LE(std::fabs(acc[size_t(k)] - exact), (n + 1) * std::ldexp(mag, -24))
              << isa_name(isa) << " d " << d << " n " << n << " value " << k;
        }
      }
    }
  }
}

TEST(AttendF32, ReluScoresWithinTheSummationBound) {
  std::mt19937 rng(2);
  for (int64_t heads : {64, 16, 4}) {
    for (int64_t n : {1, 5, 16, 67}) {
      const int64_t d = 128, ld = 128;
      const std::vector<float> q = random_f32(size_t(heads * d), rng);
      const std::vector<float> w = random_f32(size_t(heads), rng);
      const std::vector<float> rows = random_f32(size_t(n * ld), rng);
      for (Isa isa : testing::isa_levels()) {
        std::vector<float> out(static_cast<size_t>(n), -1.0f), qt(q.size());
        relu_scores_transpose(q.data(), heads, d, qt.data());
        relu_scores_f32(qt.data(), w.data(), heads, rows.data(), n, d, ld, out.data(), isa);
        for (int64_t j = 0; j < n; ++j) {
          double exact = 0, mag = 0;
          for (int64_t h = 0; h < heads; ++h) {
            double dot = 0, dmag = 0;
            for (int64_t k = 0; k < d; ++k) {
              dot += double(q[size_t(h * d + k)]) * rows[size_t(j * ld + k)];
              dmag += std::fabs(double(q[size_t(h * d + k)]) * rows[size_t(j * ld + k)]);
            }
            exact += w[size_t(h)] * std::max(dot, 0.0);
            mag += std::fabs(w[size_t(h)]) * (dmag + std::fabs(dot));
          }
          // A dot product near 0 may land on either side of the ReLU: within its own error.
          ASSERT_LE(std::fabs(out[size_t(j)] - exact), (d + heads) * std::ldexp(mag, -24))
              << isa_name(isa) << " heads " << heads << " n " << n << " row " << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace moeserve
