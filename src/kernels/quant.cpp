#include "kernels/quant.h"

#include <cmath>
#include <vector>

#include "core/dtype.h"

namespace moeserve {

void quantize_fp8_1x128_ref(const uint16_t* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                            int64_t ldq, float* scales) {
  const int64_t groups = (cols + 127) / 128;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * 128, c1 = std::min<int64_t>(cols, c0 + 128);
      float amax = 1e-4f;
      for (int64_t c = c0; c < c1; ++c) {
        float a = std::fabs(bf16_to_f32(x[r * ldx + c]));
        if (a > amax) amax = a;  // NaN never wins
      }
      const float inv = 448.0f / amax;
      for (int64_t c = c0; c < c1; ++c)
        q[r * ldq + c] = f32_to_fp8e4m3(bf16_to_f32(x[r * ldx + c]) * inv);
      scales[r * groups + g] = amax / 448.0f;
    }
  }
}

void quantize_fp8_1x128(const uint16_t* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                        int64_t ldq, float* scales, Isa isa) {
  if (isa >= Isa::kAvx512) {
    return quant_detail::quantize_avx512(x, rows, cols, ldx, q, ldq, scales);
  }
  quantize_fp8_1x128_ref(x, rows, cols, ldx, q, ldq, scales);
}

void quantize_fp8_1x128_f32(const float* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                            int64_t ldq, float* scales, Isa isa) {
  if (isa >= Isa::kAvx512) {
    return quant_detail::quantize_f32_avx512(x, rows, cols, ldx, q, ldq, scales);
  }
  std::vector<uint16_t> row(static_cast<size_t>(cols));  // one row rounded to BF16
  const int64_t groups = (cols + 127) / 128;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) row[size_t(c)] = f32_to_bf16(x[r * ldx + c]);
    quantize_fp8_1x128(row.data(), 1, cols, cols, q + r * ldq, ldq, scales + r * groups, isa);
  }
}

void dequantize_fp8_1x128(const uint8_t* q, int64_t ldq, const float* scales, int64_t rows,
                          int64_t cols, uint16_t* y, int64_t ldy) {
  const int64_t groups = (cols + 127) / 128;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      y[r * ldy + c] = f32_to_bf16(fp8e4m3_to_f32(q[r * ldq + c]) * scales[r * groups + c / 128]);
}

}  // namespace moeserve
