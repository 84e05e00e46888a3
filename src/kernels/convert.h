// Row conversions between the wire and compute dtypes, for the EP dispatch/combine paths and
// the activations of the fast path. Every level gives exactly the bits of the scalar reference
// (core/dtype.h: bf16_to_f32, f32_to_bf16 (round to nearest even, NaN quieted),
// fp8e4m3_to_f32). Pure functions: any thread may call them.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"

namespace moeserve {

// out[n] = fp8e4m3_to_f32(q[c]) * scales[c / 128] (1x128 blocks, the FP8 dispatch payload).
void fp8_1x128_to_f32_row(const uint8_t* q, const float* scales, int64_t n, float* out,
                          Isa isa = active_isa());
// out[n] = bf16_to_f32(x[c]).
void bf16_to_f32_row(const uint16_t* x, int64_t n, float* out, Isa isa = active_isa());
// y[n] += w * bf16_to_f32(x[c]): the product rounded, then the add (never fused: the EP
// combine's wire numerics, emulated independently in tests/ep).
void bf16_axpy_row(float w, const uint16_t* x, int64_t n, float* y, Isa isa = active_isa());
// out[n] = f32_to_bf16(x[c]).
void f32_to_bf16_row_isa(const float* x, int64_t n, uint16_t* out, Isa isa = active_isa());
// y[n] += w * bf16_to_f32(f32_to_bf16(x[c])): bf16_axpy_row of x rounded to BF16, without the
// BF16 row in between (the EP combine of rows that stay on their rank: the same bits as sending
// them).
void bf16_round_axpy_row(float w, const float* x, int64_t n, float* y, Isa isa = active_isa());
// out[n] = f32_to_bf16(fp8e4m3_to_f32(q[c]) * scales[c / 128]): fp8_1x128_to_f32_row then
// f32_to_bf16_row in one pass (the EP dispatch's BF16 rows).
void fp8_1x128_to_bf16_row(const uint8_t* q, const float* scales, int64_t n, uint16_t* out,
                           Isa isa = active_isa());

namespace convert_detail {
void fp8_1x128_to_f32_avx512(const uint8_t* q, const float* scales, int64_t n, float* out);
void bf16_to_f32_avx512(const uint16_t* x, int64_t n, float* out);
void bf16_axpy_avx512(float w, const uint16_t* x, int64_t n, float* y);
void f32_to_bf16_avx512(const float* x, int64_t n, uint16_t* out);
void bf16_round_axpy_avx512(float w, const float* x, int64_t n, float* y);
void fp8_1x128_to_bf16_avx512(const uint8_t* q, const float* scales, int64_t n, uint16_t* out);
}  // namespace convert_detail

}  // namespace moeserve
