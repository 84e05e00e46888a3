// FP8 block-scaled GEMMs with F32 activations: gemm_fp8 (kernels/gemm_fp8.h) without rounding X
// to BF16 first.
//
//   Y[m, n] = sum_kb s[n/128][kb] * (sum_{k in block kb} X[m, k] * fp8(W[n, k]))
//
// X is F32 [M, K] (row stride ldx); W is the same PackedFp8Weight the BF16 variants use (no
// second copy of the weights). FP8 -> F32 is exact, products and sums are FP32 FMAs, and the
// block scale multiplies each 128-wide K partial sum once, so the result differs from an exact
// sum only by FP32 accumulation error (the BF16 variants add X's BF16 rounding, ~2^-9 relative
// per element). Y is F32 or BF16 (rounded to nearest even once at the end).
//
// Layouts, threading, `isa` and shape checks are those of gemm_fp8.h. Levels: both AVX-512
// levels run the AVX-512F kernel (the FP32 FMA needs no AVX-512 BF16), then AVX2, then scalar.
// Speed (docs/kernels-gemm.md): the same weight bytes as the BF16 variants, so equal at small M
// (memory bound); at large M half the BF16 variant's peak on CPUs whose vdpbf16ps issues as many
// zmm per cycle as FP32 FMAs (Zen 4), equal where vdpbf16ps is half rate.
#pragma once

#include <cstdint>

#include "kernels/gemm_fp8.h"

namespace moeserve {

// x: F32 [m, w.k], row stride ldx.
void gemm_fp8_f32x(const float* x, int64_t m, int64_t ldx, const PackedFp8Weight& w, GemmOutput y,
                   ThreadPool* pool, Isa isa = active_isa());

// experts: n_experts weights of equal shape; offsets: [n_experts + 1], non-decreasing, from 0.
void gemm_fp8_f32x_grouped_contiguous(const float* x, int64_t ldx, const int64_t* offsets,
                                      const PackedFp8Weight* const* experts, int64_t n_experts,
                                      GemmOutput y, ThreadPool* pool, Isa isa = active_isa());

// x: [n_experts][capacity][k] (row stride ldx); counts[e] in [0, capacity]; rows at or beyond
// counts[e] of Y are not written.
void gemm_fp8_f32x_grouped_masked(const float* x, int64_t ldx, int64_t capacity,
                                  const int32_t* counts, const PackedFp8Weight* const* experts,
                                  int64_t n_experts, GemmOutput y, ThreadPool* pool,
                                  Isa isa = active_isa());

// The scalar reference on the unpacked checkpoint layout, in double: y [m, n] F32, row stride n.
void gemm_fp8_f32x_ref(const float* x, int64_t m, int64_t ldx, const uint8_t* w,
                       const float* scale_inv, int64_t n, int64_t k, float* y);

}  // namespace moeserve
