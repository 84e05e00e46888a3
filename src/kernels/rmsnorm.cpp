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

void rmsnorm(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
             float eps, float* y, int64_t ldy) {
  rmsnorm_isa(x, n_rows, dim, ldx, weight, eps, y, ldy, active_isa());
}

void rmsnorm_isa(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                 float eps, float* y, int64_t ldy, Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
    case Isa::kAvx512Bf16:
    case Isa::kAmx:
      return rmsnorm_detail::rmsnorm_avx512(x, n_rows, dim, ldx, weight, eps, y, ldy);
    case Isa::kAvx2:
      return rmsnorm_detail::rmsnorm_avx2(x, n_rows, dim, ldx, weight, eps, y, ldy);
    case Isa::kScalar:
      break;
  }
  rmsnorm_ref(x, n_rows, dim, ldx, weight, eps, y, ldy);
}

float rmsnorm_detail::inv_rms(const double* partial, int64_t dim, float eps) {
  double ss = 0.0;
  for (int64_t j = 0; j < kPartials; ++j) ss += partial[j];
  return float(1.0 / std::sqrt(ss / double(dim) + eps));
}

}  // namespace moeserve
