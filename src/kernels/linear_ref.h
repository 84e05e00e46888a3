// Reference linear layer: y[m, n] = sum_k x[m, k] * W[n, k], FP32 activations.
//
// The simple path that every fast GEMM is tested against, and the engine's reference forward.
// For FP8 weights the per-block scale is applied once per block_cols-wide K block to an FP32
// partial sum (DeepGEMM's two-level accumulation). Threads split N. `pool` may be nullptr.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/weight_view.h"

namespace moeserve {

// x: [m, w.cols] with row stride ldx; y: [m, w.rows] with row stride ldy.
void linear_ref(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y, int64_t ldy,
                ThreadPool* pool);

}  // namespace moeserve
