#include "kernels/linear_ref.h"

#include <vector>

namespace moeserve {

void linear_ref(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y, int64_t ldy,
                ThreadPool* pool) {
  const int64_t k = w.cols;
  const int64_t bk = w.dtype == DType::kF8E4M3 ? w.block_cols : k;
  auto rows = [&](int64_t n_begin, int64_t n_end) {
    std::vector<float> wrow(k);  // one dequantized weight row, without its block scale
    const float* lut = fp8e4m3_table();
    for (int64_t n = n_begin; n < n_end; ++n) {
      const float* scales = nullptr;
      if (w.dtype == DType::kF8E4M3) {
        const uint8_t* p = w.data + n * k;
        for (int64_t c = 0; c < k; ++c) wrow[c] = lut[p[c]];
        scales = w.scale_inv + (n / w.block_rows) * w.scale_cols();
      } else {
        w.row_to_f32(n, wrow.data());
      }
      for (int64_t i = 0; i < m; ++i) {
        const float* xi = x + i * ldx;
        float acc = 0.0f;
        for (int64_t k0 = 0, b = 0; k0 < k; k0 += bk, ++b) {
          int64_t k1 = k0 + bk < k ? k0 + bk : k;
          float part = 0.0f;
          for (int64_t c = k0; c < k1; ++c) part += xi[c] * wrow[c];
          acc += scales ? part * scales[b] : part;
        }
        y[i * ldy + n] = acc;
      }
    }
  };
  if (pool) {
    pool->parallel_for(w.rows, rows, 16);
  } else {
    rows(0, w.rows);
  }
}

}  // namespace moeserve
