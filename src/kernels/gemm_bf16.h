// BF16 GEMM for the weights the checkpoints keep in BF16 (lm_head, embeddings when tied, MoE
// gate) and for per-head absorbed-attention matrices dequantized at load:
//
//   Y[m, n] = sum_k X[m, k] * W[n, k]       X, W: BF16 bits; products and sums in FP32; Y F32.
//
// Row-major, any sizes. Threads split N; `pool` may be nullptr. At small M the kernel streams W
// once (memory-bound, the lm_head case); each W row is reused for all M rows while in L1.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/cpu_features.h"

namespace moeserve {

// x: [m, k] row stride ldx; w: [n, k] row stride ldw; y: [m, n] row stride ldy.
void gemm_bf16(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n, int64_t k,
               int64_t ldw, float* y, int64_t ldy, ThreadPool* pool, Isa isa = active_isa());

// The scalar reference (FP32 accumulation in k order).
void gemm_bf16_ref(const uint16_t* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n,
                   int64_t k, int64_t ldw, float* y, int64_t ldy);

// The same in FP32 (x, w, y all F32): for small matrices whose BF16 rounding would cost too
// much accuracy (the per-head absorbed-attention projections).
void gemm_f32(const float* x, int64_t m, int64_t ldx, const float* w, int64_t n, int64_t k,
              int64_t ldw, float* y, int64_t ldy, ThreadPool* pool, Isa isa = active_isa());

// gemm_f32 reading W as BF16 (widened exactly in registers): the bits of gemm_f32 on W's F32
// copy, at half its bytes (BF16 checkpoint matrices whose products are F32: the MoE router,
// DeepSeek-V4's compressors and indexer head weights).
void gemm_f32_bf16w(const float* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n, int64_t k,
                    int64_t ldw, float* y, int64_t ldy, ThreadPool* pool, Isa isa = active_isa());

// FP32 with the weight stored K-major: Y[m, n] = sum_k X[m, k] * Wt[k, n] (wt row stride ldwt).
// Broadcast-and-FMA over output columns, no horizontal sums: the fast form for small K.
void gemm_f32_kn(const float* x, int64_t m, int64_t ldx, const float* wt, int64_t n, int64_t k,
                 int64_t ldwt, float* y, int64_t ldy, ThreadPool* pool, Isa isa = active_isa());

// F32 -> BF16 (round to nearest even) for n values.
void f32_to_bf16_row(const float* x, int64_t n, uint16_t* out);

}  // namespace moeserve
