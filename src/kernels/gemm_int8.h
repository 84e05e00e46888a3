// INT8 GEMMs with 1x128 group scales on both sides (the opt-in `--gemm-int8` path;
// docs/kernels-int8.md).
//
//   Y[m, n] = sum_kb sx[m][kb] * sw[n][kb] * (sum_{k in block kb} qx[m, k] * qw[n, k])
//
// qw, sw: the weight requantized at load, per row and 128-wide K block, symmetric: sw = max|w| /
// 127, qw = round-to-nearest-even(w * (127 / max|w|)) in [-127, 127], where w is the checkpoint's
// value (FP8 times its 128x128 block scale, or BF16). qx, sx: the BF16 activations quantized the
// same way per call, per row and K block (sx = max|x| / 127, qx = round-to-nearest-even(x * (127 /
// max|x|)); a block of zeros has sx = 0, and a block with an infinite or NaN value has sx = NaN, so
// its outputs are NaN, never silently finite). The inner sums are exact in INT32 (|sum| <= 127 *
// 127 * 128 < 2^24, so also exact in F32); the promotion per K block is F32: s = sx * sw, then tot
// = f * s for the first block and fma(f, s, tot) after. Every ISA level computes exactly this, so
// the levels agree bit for bit, a row's result never depends on M or on the thread split, and a
// process may pick the level per call (the AMX tile unit for many rows, VNNI dot products for
// decode) without changing any output.
//
// Levels: scalar; AVX-512 VNNI (`vpdpbusd`, at the avx512bf16 level: every CPU with AVX-512 BF16
// has VNNI); AMX (`TDPBSSD`) for jobs (a call, or one expert's rows) of more than 16 rows, the
// VNNI code for fewer.
// The AVX2 and AVX-512F levels run the scalar code (correct, slow): the path is meant for CPUs
// with INT8 dot products. The default level is active_int8_isa(): AMX wherever the CPU has it.
//
// Layouts as gemm_fp8 (dense, grouped contiguous with or without gathered rows, grouped masked),
// with the same contracts on offsets, counts and strides.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm_fp8.h"

namespace moeserve {

struct PackedInt8Weight {
  static constexpr int64_t kPanelCols = 64;  // output columns per panel
  static constexpr int64_t kBlockK = 128;    // K per scale group and per tile
  static constexpr int64_t kTileBytes = kPanelCols * kBlockK;

  int64_t n = 0, k = 0;
  // Tiles [n_panels][k_blocks], each [32 k-quads][64 columns][4 k] signed bytes (AMX's B layout
  // for TDPBSSD and the 4-byte lanes of vpdpbusd), zero past N and K; 64-byte aligned.
  std::shared_ptr<int8_t[]> data;
  // sw per column and K block: [n_panels][k_blocks][64], zero past N.
  std::vector<float> scales;

  int64_t n_panels() const { return (n + kPanelCols - 1) / kPanelCols; }
  int64_t k_blocks() const { return (k + kBlockK - 1) / kBlockK; }
  const int8_t* tile(int64_t panel, int64_t kb) const {
    return data.get() + (panel * k_blocks() + kb) * kTileBytes;
  }
  // qw[row, col] and sw[row][col / 128].
  int8_t at(int64_t row, int64_t col) const;
  float scale(int64_t row, int64_t kb) const {
    return scales[size_t(((row / kPanelCols) * k_blocks() + kb) * kPanelCols + row % kPanelCols)];
  }
  size_t bytes() const {
    return size_t(n_panels() * k_blocks()) * (kTileBytes + kPanelCols * sizeof(float));
  }
};

// From the checkpoint's FP8 weight (w [n, k] e4m3 bytes, scale_inv [ceil(n/128)][ceil(k/128)]).
PackedInt8Weight pack_int8_weight(const uint8_t* w, const float* scale_inv, int64_t n, int64_t k);
// From a packed FP8 weight (the same values as from the checkpoint).
PackedInt8Weight pack_int8_weight(const PackedFp8Weight& w);
// From BF16 (the lm_head): w [n, k] bits, row stride ldw. `pool` (may be nullptr) splits the work.
PackedInt8Weight pack_int8_weight_bf16(const uint16_t* w, int64_t n, int64_t k, int64_t ldw,
                                       ThreadPool* pool = nullptr);

// x: BF16 bits [m, w.k], row stride ldx.
void gemm_int8(const uint16_t* x, int64_t m, int64_t ldx, const PackedInt8Weight& w, GemmOutput y,
               ThreadPool* pool, Isa isa = active_int8_isa());
void gemm_int8_grouped_contiguous(const uint16_t* x, int64_t ldx, const int64_t* offsets,
                                  const PackedInt8Weight* const* experts, int64_t n_experts,
                                  GemmOutput y, ThreadPool* pool, Isa isa = active_int8_isa());
void gemm_int8_grouped_contiguous_gather(const uint16_t* x, int64_t ldx, const int32_t* x_rows,
                                         const int64_t* offsets,
                                         const PackedInt8Weight* const* experts, int64_t n_experts,
                                         GemmOutput y, ThreadPool* pool,
                                         Isa isa = active_int8_isa());
void gemm_int8_grouped_masked(const uint16_t* x, int64_t ldx, int64_t capacity,
                              const int32_t* counts, const PackedInt8Weight* const* experts,
                              int64_t n_experts, GemmOutput y, ThreadPool* pool,
                              Isa isa = active_int8_isa());

// One row's activation quantization, as every level does it (for tests and references): x [k]
// BF16 bits -> q [k_blocks * 128] (zero past k), sx [k_blocks].
void quantize_row_int8(const uint16_t* x, int64_t k, int8_t* q, float* sx);

}  // namespace moeserve
