// WeightView: a read-only description of a 2-D weight matrix [rows, cols] stored row-major in
// someone else's memory (usually an mmap'd checkpoint), in F32, BF16, F16, FP8 e4m3 or FP4
// e2m1. FP8 and FP4 weights carry F32 `scale_inv` per block_rows x block_cols block, shape
// [ceil(rows/block_rows), ceil(cols/block_cols)]: value = w * scale_inv[r/br][c/bc]. FP4
// (DeepSeek-V4's routed experts, MXFP4: block 1 x 32) packs two values a byte, element 2j of a
// row in the low nibble of its byte j.
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
  const float* scale_inv = nullptr;  // FP8 and FP4 only
  int64_t block_rows = 128;
  int64_t block_cols = 128;

  int64_t scale_cols() const { return (cols + block_cols - 1) / block_cols; }
  bool block_scaled() const { return dtype == DType::kF8E4M3 || dtype == DType::kF4E2M1; }
  int64_t row_bytes() const {
    return dtype == DType::kF4E2M1 ? cols / 2 : cols * int64_t(dtype_size(dtype));
  }
  size_t bytes() const { return size_t(rows * row_bytes()); }  // of data
  // Dequantizes row r (all cols) into out[cols] as float.
  void row_to_f32(int64_t r, float* out) const;
  // A view of rows [begin, begin + n) (begin must be a multiple of block_rows when scaled).
  WeightView row_slice(int64_t begin, int64_t n) const;
};

}  // namespace moeserve
