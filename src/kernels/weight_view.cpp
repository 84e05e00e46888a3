#include "kernels/weight_view.h"

#include "core/check.h"

namespace moeserve {

void WeightView::row_to_f32(int64_t r, float* out) const {
  switch (dtype) {
    case DType::kF32: {
      const float* p = reinterpret_cast<const float*>(data) + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = p[c];
      return;
    }
    case DType::kBF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(data) + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_f32(p[c]);
      return;
    }
    case DType::kF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(data) + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = f16_to_f32(p[c]);
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* p = data + r * cols;
      const float* lut = fp8e4m3_table();
      const float* s = scale_inv + (r / block_rows) * scale_cols();
      for (int64_t c = 0; c < cols; ++c) out[c] = lut[p[c]] * s[c / block_cols];
      return;
    }
    case DType::kF4E2M1: {
      const uint8_t* p = data + r * (cols / 2);
      const float* s = scale_inv + (r / block_rows) * scale_cols();
      for (int64_t c = 0; c < cols; c += 2) {
        out[c] = fp4e2m1_to_f32(p[c / 2] & 0xf) * s[c / block_cols];
        out[c + 1] = fp4e2m1_to_f32(p[c / 2] >> 4) * s[(c + 1) / block_cols];
      }
      return;
    }
    default:
      CHECK(false, "WeightView dtype must be a float type");
  }
}

WeightView WeightView::row_slice(int64_t begin, int64_t n) const {
  CHECK(begin >= 0 && begin + n <= rows, "row slice out of range");
  WeightView v = *this;
  v.rows = n;
  v.data = data + begin * row_bytes();
  if (block_scaled()) {
    CHECK(begin % block_rows == 0, "a scaled row slice must start on a scale block");
    v.scale_inv = scale_inv + (begin / block_rows) * scale_cols();
  }
  return v;
}

}  // namespace moeserve
