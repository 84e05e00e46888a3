// 1x128 activation quantization to FP8 e4m3 (the FP8 dispatch payload of DeepEP; DeepGEMM's
// per_token_cast_to_fp8), and its inverse.
//
// For each row and each group of 128 columns (the last group may be partial):
//   amax  = max(|x|) over the group in F32, at least 1e-4
//   q     = e4m3(x * (448 / amax))        (F32 multiply, round to nearest even, saturating)
//   scale = amax / 448                    (F32; dequantized x ~= fp8(q) * scale)
// x is BF16 [rows, cols] (row stride ldx); q is [rows, cols] bytes (row stride ldq); scales is
// [rows, ceil(cols/128)] F32, dense. Every level gives the same bits as the scalar reference
// (quantize_fp8_1x128_ref). Pure functions: any thread may call them.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"

namespace moeserve {

void quantize_fp8_1x128(const uint16_t* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                        int64_t ldq, float* scales, Isa isa = active_isa());
void quantize_fp8_1x128_ref(const uint16_t* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                            int64_t ldq, float* scales);

// The same from F32 rows x [rows, cols] (row stride ldx), rounded to BF16 first (nearest even,
// in registers): the bits quantize_fp8_1x128 gives on f32_to_bf16(x), in one pass over x and
// without the BF16 copy (the EP dispatch's FP8 payload).
void quantize_fp8_1x128_f32(const float* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                            int64_t ldq, float* scales, Isa isa = active_isa());

// y [rows, cols] BF16 (row stride ldy) = bf16(fp8(q) * scale), rounded to nearest even.
void dequantize_fp8_1x128(const uint8_t* q, int64_t ldq, const float* scales, int64_t rows,
                          int64_t cols, uint16_t* y, int64_t ldy);

namespace quant_detail {
void quantize_avx512(const uint16_t* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                     int64_t ldq, float* scales);
void quantize_f32_avx512(const float* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                         int64_t ldq, float* scales);
}  // namespace quant_detail

}  // namespace moeserve
