// WeightView: a read-only description of a 2-D weight matrix [rows, cols] stored row-major in
// someone else's memory (usually an mmap'd checkpoint), in F32, BF16, F16 or FP8 e4m3. FP8
// weights carry F32 `scale_inv` per block_rows x block_cols block, shape
// [ceil(rows/block_rows), ceil(cols/block_cols)]: value = fp8(w) * scale_inv[r/br][c/bc].
// Kernels take WeightViews and never own the bytes.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace moeserve {

struct WeightView {
  DType dtype = DType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  const float* scale_inv = nullptr;  // FP8 only
  int64_t block_rows = 128;
  int64_t block_cols = 128;

  int64_t scale_cols() const { return (cols + block_cols - 1) / block_cols; }
  size_t bytes() const { return size_t(rows * cols) * dtype_size(dtype); }  // of data
  // Dequantizes row r (all cols) into out[cols] as float.
  void row_to_f32(int64_t r, float* out) const;
  // A view of rows [begin, begin + n) (begin must be a multiple of block_rows for FP8).
  WeightView row_slice(int64_t begin, int64_t n) const;
};

}  // namespace moeserve
