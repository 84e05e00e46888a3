#include "kernels/rmsnorm.h"

#include <cmath>

namespace moeserve {

void rmsnorm_ref(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                 float eps, float* y, int64_t ldy) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    float inv = float(1.0 / std::sqrt(ss / double(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

}  // namespace moeserve
