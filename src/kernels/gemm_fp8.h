// FP8 block-scaled GEMMs (DeepGEMM's contract on CPUs).
//
//   Y[m, n] = sum_kb s[n/128][kb] * (sum_{k in block kb} X[m, k] * fp8(W[n, k]))
//
// X is BF16 [M, K] (row stride ldx), W is FP8 e4m3 row-major [N, K] as in the checkpoint, with
// F32 `weight_scale_inv` s per 128x128 block, shape [ceil(N/128), ceil(K/128)]. Products and
// accumulation are FP32; the block scale multiplies each 128-wide K partial sum once (two-level
// accumulation). Y is F32 or BF16 (rounded to nearest even once at the end). N and K are any
// positive sizes: edge blocks are partial. FP8 NaN bytes (0x7f/0xff) are not supported in weights
// (checkpoints have none); the AVX-512 BF16 level reads them as NaN, the other SIMD levels as
// +-480.
//
// Weights are repacked once at load by pack_fp8_weight into PackedFp8Weight: still one FP8 byte
// per weight (no dequantized copy), laid out in 64-column panels so a 64x128 tile converts to
// BF16 with a few vector instructions (docs/kernels-gemm.md). PackedFp8Weight is immutable after
// packing; any number of threads may read it.
//
// Layouts (as DeepGEMM):
//   gemm_fp8                     dense: X [M, K] -> Y [M, N].
//   gemm_fp8_grouped_contiguous  rows of X sorted by expert: expert e owns rows
//                                [offsets[e], offsets[e+1]) of X and Y and uses experts[e].
//   gemm_fp8_grouped_masked      X [E][capacity][K]; expert e's rows are the first counts[e] of
//                                its slab; Y [E][capacity][N]; rows at or beyond counts[e] are
//                                not written.
// All take a ThreadPool (nullptr = calling thread only) and split N panels (and experts) among
// its threads; call from one thread at a time per pool. `isa` selects the implementation level
// (default active_isa(); it must be at most cpu_isa()). Shape mismatches are programming errors
// (CHECK): callers validate model shapes at load.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"

namespace moeserve {

struct PackedFp8Weight {
  static constexpr int64_t kPanelCols = 64;  // output columns per panel
  static constexpr int64_t kBlockK = 128;    // K per scale block and per tile
  static constexpr int64_t kTileBytes = kPanelCols * kBlockK;

  int64_t n = 0, k = 0;
  // Tiles [n_panels][k_blocks], each [64 k-pairs][64 columns][2 k] FP8 bytes, zero-padded past
  // N and K; 64-byte aligned.
  std::shared_ptr<uint8_t[]> data;
  std::vector<float> scale_inv;  // [n_blocks][k_blocks], a copy of weight_scale_inv

  int64_t n_panels() const { return (n + kPanelCols - 1) / kPanelCols; }
  int64_t k_blocks() const { return (k + kBlockK - 1) / kBlockK; }
  int64_t n_blocks() const { return (n + kBlockK - 1) / kBlockK; }
  const uint8_t* tile(int64_t panel, int64_t kb) const {
    return data.get() + (panel * k_blocks() + kb) * kTileBytes;
  }
  float scale(int64_t panel, int64_t kb) const {
    return scale_inv[size_t((panel / 2) * k_blocks() + kb)];
  }
  // The FP8 byte of W[row, col] (for the scalar level and tests).
  uint8_t at(int64_t row, int64_t col) const;
  size_t bytes() const { return size_t(n_panels() * k_blocks() * kTileBytes); }
};

// w: [n, k] FP8 bytes, row-major; scale_inv: [ceil(n/128), ceil(k/128)].
PackedFp8Weight pack_fp8_weight(const uint8_t* w, const float* scale_inv, int64_t n, int64_t k);

// Where a GEMM writes: Y [rows, N] with row stride ld (elements), F32 or BF16.
struct GemmOutput {
  void* data = nullptr;
  DType dtype = DType::kF32;  // kF32 or kBF16
  int64_t ld = 0;
};

// x: BF16 bits [m, w.k], row stride ldx.
void gemm_fp8(const uint16_t* x, int64_t m, int64_t ldx, const PackedFp8Weight& w, GemmOutput y,
              ThreadPool* pool, Isa isa = active_isa());

// experts: n_experts weights of equal shape; offsets: [n_experts + 1], non-decreasing, from 0.
void gemm_fp8_grouped_contiguous(const uint16_t* x, int64_t ldx, const int64_t* offsets,
                                 const PackedFp8Weight* const* experts, int64_t n_experts,
                                 GemmOutput y, ThreadPool* pool, Isa isa = active_isa());

// The same with the rows of X gathered: row i of the grouped problem (i in [0, offsets[n]))
// reads x + x_rows[i] * ldx, so rows that several experts share (a token's top-k) need not be
// copied once per expert beforehand (DeepEP's receive buffer holds each token once). Each
// thread copies its experts' rows together before the kernel runs; results equal
// gemm_fp8_grouped_contiguous on the copied rows, bit for bit.
void gemm_fp8_grouped_contiguous_gather(const uint16_t* x, int64_t ldx, const int32_t* x_rows,
                                        const int64_t* offsets,
                                        const PackedFp8Weight* const* experts, int64_t n_experts,
                                        GemmOutput y, ThreadPool* pool, Isa isa = active_isa());

// x: [n_experts][capacity][k] (row stride ldx); counts[e] in [0, capacity].
void gemm_fp8_grouped_masked(const uint16_t* x, int64_t ldx, int64_t capacity,
                             const int32_t* counts, const PackedFp8Weight* const* experts,
                             int64_t n_experts, GemmOutput y, ThreadPool* pool,
                             Isa isa = active_isa());

// BF16 weights (the lm_head) in the same tile layout, for the same tiled kernel without the
// conversion: Y[m, n] = sum_k X[m, k] * W[n, k], F32 products and sums, per 128-wide K block
// then across blocks (so a row's result never depends on M or on the thread split). Repacked
// once at load: same 2 bytes per weight, zero-padded to whole tiles. At M >= 8 the 6-row x
// 64-column register blocks need no horizontal sums and reach the FP8 kernel's compute
// efficiency; gemm_bf16 (row-major W) stays for unpacked weights. The AVX-512F and AVX2 levels
// run gemm_fp8_f32x's F32 kernels on tiles converted exactly to F32 (X widened to F32 once).
struct PackedBf16Weight {
  static constexpr int64_t kPanelCols = PackedFp8Weight::kPanelCols;
  static constexpr int64_t kBlockK = PackedFp8Weight::kBlockK;
  static constexpr int64_t kTileElems = kPanelCols * kBlockK;

  int64_t n = 0, k = 0;
  // Tiles [n_panels][k_blocks], each [64 k-pairs][64 columns][2 k] BF16; 64-byte aligned.
  std::shared_ptr<uint16_t[]> data;

  int64_t n_panels() const { return (n + kPanelCols - 1) / kPanelCols; }
  int64_t k_blocks() const { return (k + kBlockK - 1) / kBlockK; }
  const uint16_t* tile(int64_t panel, int64_t kb) const {
    return data.get() + (panel * k_blocks() + kb) * kTileElems;
  }
  // The BF16 bits of W[row, col].
  uint16_t at(int64_t row, int64_t col) const;
  size_t bytes() const { return size_t(n_panels() * k_blocks() * kTileElems * 2); }
};

// w: [n, k] BF16 bits, row stride ldw. `pool` (may be nullptr) splits the copy.
PackedBf16Weight pack_bf16_weight(const uint16_t* w, int64_t n, int64_t k, int64_t ldw,
                                  ThreadPool* pool = nullptr);

// x: BF16 bits [m, w.k], row stride ldx; y: F32 [m, w.n], row stride ldy.
void gemm_bf16_packed(const uint16_t* x, int64_t m, int64_t ldx, const PackedBf16Weight& w,
                      float* y, int64_t ldy, ThreadPool* pool, Isa isa = active_isa());

// The scalar reference on the unpacked checkpoint layout, in double: y [m, n] F32, row stride n.
void gemm_fp8_ref(const uint16_t* x, int64_t m, int64_t ldx, const uint8_t* w,
                  const float* scale_inv, int64_t n, int64_t k, float* y);

}  // namespace moeserve
