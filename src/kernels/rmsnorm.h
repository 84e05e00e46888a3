// RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, per row, FP32. x and y may alias (y == x, the
// same row stride) but must not overlap otherwise.
//
// rmsnorm_ref is the reference path's kernel (the oracle against Hugging Face): squares summed
// in FP64, 1/sqrt in FP64 rounded once to F32, then y = (x * inv) * weight in F32.
// rmsnorm is the fast path's: the same arithmetic with the sum of squares split over 32
// interleaved FP64 partial sums (element i goes to sum i % 32; every square of a float is exact
// in FP64) added in a fixed order. It gives the reference's bits except where the two FP64 sums
// round 1/sqrt to neighbouring floats (then 1-2 ulp). A row's result depends on nothing else in
// the call (batch-invariant); the AVX2 and AVX-512 levels give the same bits; the scalar level
// is rmsnorm_ref. Pure functions: any thread may call them.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"

namespace moeserve {

// x, y: [n_rows, dim] with row strides ldx, ldy; weight: [dim].
void rmsnorm_ref(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                 float eps, float* y, int64_t ldy);

// The fast kernel at active_isa() (the same signature as rmsnorm_ref, so that a caller can pick
// either: `(fast ? rmsnorm : rmsnorm_ref)(...)`).
void rmsnorm(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
             float eps, float* y, int64_t ldy);
// The fast kernel at a given level (tests).
void rmsnorm_isa(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                 float eps, float* y, int64_t ldy, Isa isa);

namespace rmsnorm_detail {
constexpr int64_t kPartials = 32;
// 1 / sqrt(sum(partial[0..31]) / dim + eps) rounded to F32, the sums added in index order.
float inv_rms(const double* partial, int64_t dim, float eps);
void rmsnorm_avx512(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                    float eps, float* y, int64_t ldy);
void rmsnorm_avx2(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                  float eps, float* y, int64_t ldy);
}  // namespace rmsnorm_detail

}  // namespace moeserve
