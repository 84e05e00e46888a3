// INT4 GEMMs for the routed experts (`--expert-dtype int4`, docs/quantization.md): weights
// requantized at load to 4 bits per 1x128 group, asymmetric, activations to INT8 per 1x128 as in
// gemm_int8.h.
//
//   Y[m, n] = sum_kb sx[m][kb] * (sw[n][kb] * D + mw[n][kb] * Sx),
//   D = sum_{k in kb} qx[m, k] * qw[n, k],   Sx = sum_{k in kb} qx[m, k]
//
// qw, sw, mw: per row and 128-wide K block of the checkpoint's value w (FP8 times its 128x128
// block scale), lo = min w, hi = max w, sw = (hi - lo) / 15, qw = round-to-nearest-even((w - lo)
// / sw) clamped to [0, 15], mw = lo; so w ~ sw * qw + mw (a block of one value: sw = 0, qw = 0,
// mw = that value). Asymmetric at 128 because it measured best per byte: 0.5625 bytes per
// weight, a relative RMS error of 0.100 on tiny-py's experts against 0.118 symmetric at 128 and
// 0.109 symmetric at 64 (the same bytes; docs/quantization.md). qx, sx: gemm_int8.h's. D and
// Sx are exact in INT32 and F32 (|D| <= 15 * 127 * 128 < 2^24). Per K block, in F32: t =
// fma(float(D), sw, mw * float(Sx)); tot = t * sx for the first block, fma(t, sx, tot) after.
// Every level computes exactly this, so the levels agree bit for bit and a row's result never
// depends on M or on the thread split.
//
// Levels: scalar; AVX-512 VNNI (`vpdpbusd` on the weights' unsigned nibbles, unpacked with two
// shifts and masks per 128 weights; the AVX-512 BF16 level's CPUs run it, and the AMX level's
// calls of at most 16 rows); AMX (calls of more rows: a panel's chunk of tiles unpacked to
// gemm_int8's layout in L2, then TDPBSUD as gemm_int8's AMX level runs TDPBSSD). Decode reads
// half the bytes of INT8. Layouts as gemm_fp8 (dense, grouped contiguous with or without
// gathered rows, grouped masked).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm_fp8.h"

namespace moeserve {

struct PackedInt4Weight {
  static constexpr int64_t kPanelCols = 64;  // output columns per panel
  static constexpr int64_t kBlockK = 128;    // K per group and per tile
  static constexpr int64_t kTileBytes = kPanelCols * kBlockK / 2;

  int64_t n = 0, k = 0;
  // Tiles [n_panels][k_blocks], each [32 k-quads][2][64] bytes. The INT8 layout of a quad
  // (gemm_int8.h: [64 columns][4 k], 256 values) split in four runs of 64: byte i of half h
  // holds value 128 h + i in its low nibble and value 128 h + 64 + i in its high one. Zero past
  // N and K; 64-byte aligned.
  std::shared_ptr<uint8_t[]> data;
  // Per column and K block, [n_panels][k_blocks][2][64]: sw, then mw; zero past N.
  std::vector<float> scales;

  int64_t n_panels() const { return (n + kPanelCols - 1) / kPanelCols; }
  int64_t k_blocks() const { return (k + kBlockK - 1) / kBlockK; }
  const uint8_t* tile(int64_t panel, int64_t kb) const {
    return data.get() + (panel * k_blocks() + kb) * kTileBytes;
  }
  // qw[row, col] in [0, 15], sw and mw of (row, col / 128).
  uint8_t at(int64_t row, int64_t col) const;
  float scale(int64_t row, int64_t kb) const {
    return scales[size_t((((row / kPanelCols) * k_blocks() + kb) * 2) * kPanelCols +
                         row % kPanelCols)];
  }
  float min(int64_t row, int64_t kb) const {
    return scales[size_t((((row / kPanelCols) * k_blocks() + kb) * 2 + 1) * kPanelCols +
                         row % kPanelCols)];
  }
  size_t bytes() const {
    return size_t(n_panels() * k_blocks()) * (kTileBytes + 2 * kPanelCols * sizeof(float));
  }
  size_t tile_bytes() const { return size_t(n_panels() * k_blocks() * kTileBytes); }
};

// From the checkpoint's FP8 weight (w [n, k] e4m3 bytes, scale_inv [ceil(n/128)][ceil(k/128)]).
PackedInt4Weight pack_int4_weight(const uint8_t* w, const float* scale_inv, int64_t n, int64_t k);
// From a packed FP8 weight (the same values as from the checkpoint).
PackedInt4Weight pack_int4_weight(const PackedFp8Weight& w);
// From BF16 bits [n, k], row stride ldw (the lm_head with --lm-head-dtype int4); the panels
// spread over the pool when one is given.
PackedInt4Weight pack_int4_weight_bf16(const uint16_t* w, int64_t n, int64_t k, int64_t ldw,
                                       ThreadPool* pool = nullptr);

// x: BF16 bits [m, w.k], row stride ldx. The INT4 levels: AMX, AVX-512 VNNI where the CPU has
// AVX-512 BF16, else scalar.
void gemm_int4(const uint16_t* x, int64_t m, int64_t ldx, const PackedInt4Weight& w, GemmOutput y,
               ThreadPool* pool, Isa isa = cpu_isa());
void gemm_int4_grouped_contiguous(const uint16_t* x, int64_t ldx, const int64_t* offsets,
                                  const PackedInt4Weight* const* experts, int64_t n_experts,
                                  GemmOutput y, ThreadPool* pool, Isa isa = cpu_isa());
void gemm_int4_grouped_contiguous_gather(const uint16_t* x, int64_t ldx, const int32_t* x_rows,
                                         const int64_t* offsets,
                                         const PackedInt4Weight* const* experts, int64_t n_experts,
                                         GemmOutput y, ThreadPool* pool, Isa isa = cpu_isa());
void gemm_int4_grouped_masked(const uint16_t* x, int64_t ldx, int64_t capacity,
                              const int32_t* counts, const PackedInt4Weight* const* experts,
                              int64_t n_experts, GemmOutput y, ThreadPool* pool,
                              Isa isa = cpu_isa());

}  // namespace moeserve
