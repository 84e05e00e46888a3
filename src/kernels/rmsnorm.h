// RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, per row, FP32. x and y may alias.
#pragma once

#include <cstdint>

namespace moeserve {

// x, y: [n_rows, dim] with row strides ldx, ldy; weight: [dim].
void rmsnorm_ref(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                 float eps, float* y, int64_t ldy);

}  // namespace moeserve
