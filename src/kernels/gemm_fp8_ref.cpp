// The scalar levels of gemm_fp8: the double-precision reference on the checkpoint layout, and
// the scalar fallback on the packed layout (FP32, the same two-level order as the SIMD levels).
#include <algorithm>

#include "core/dtype.h"
#include "kernels/gemm_fp8.h"
#include "kernels/gemm_fp8_internal.h"

namespace moeserve {

void gemm_fp8_ref(const uint16_t* x, int64_t m, int64_t ldx, const uint8_t* w,
                  const float* scale_inv, int64_t n, int64_t k, float* y) {
  const int64_t kbs = (k + 127) / 128;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t kb = 0; kb < kbs; ++kb) {
        double part = 0;  // one 128-wide K block
        for (int64_t kk = kb * 128; kk < std::min(k, kb * 128 + 128); ++kk) {
          part += double(bf16_to_f32(x[i * ldx + kk])) * double(fp8e4m3_to_f32(w[j * k + kk]));
        }
        acc += double(scale_inv[(j / 128) * kbs + kb]) * part;
      }
      y[i * n + j] = float(acc);
    }
  }
}

namespace gemm_detail {

void panels_scalar(const GemmJob& job, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    int64_t c1 = std::min<int64_t>(kPanelCols, job.n - p * kPanelCols);
    for (int64_t i = 0; i < job.m; ++i) {
      const uint16_t* xr = job.x + i * job.ldx;  // [k]
      for (int64_t c = 0; c < c1; ++c) {
        float acc = 0;
        for (int64_t kb = 0; kb < job.k_blocks; ++kb) {
          const uint8_t* t = job.tiles + (p * job.k_blocks + kb) * kTileBytes;
          int64_t kw = std::min<int64_t>(kBlockK, job.k - kb * kBlockK);
          float part = 0;
          if (job.bf16_tiles) {
            const uint16_t* tb =
                reinterpret_cast<const uint16_t*>(job.tiles) + (p * job.k_blocks + kb) * kTileBytes;
            for (int64_t kk = 0; kk < kw; ++kk) {
              part += bf16_to_f32(xr[kb * kBlockK + kk]) *
                      bf16_to_f32(tb[(kk / 2) * 128 + c * 2 + kk % 2]);
            }
            acc += part;
            continue;
          }
          for (int64_t kk = 0; kk < kw; ++kk) {
            part += bf16_to_f32(xr[kb * kBlockK + kk]) *
                    fp8e4m3_to_f32(t[(kk / 2) * 128 + c * 2 + kk % 2]);
          }
          acc += job.scales[(p / 2) * job.k_blocks + kb] * part;
        }
        int64_t col = p * kPanelCols + c;
        if (job.y_bf16) {
          static_cast<uint16_t*>(job.y)[i * job.ldy + col] = f32_to_bf16(acc);
        } else {
          static_cast<float*>(job.y)[i * job.ldy + col] = acc;
        }
      }
    }
  }
}

}  // namespace gemm_detail
}  // namespace moeserve
