// FP4 GEMMs for DeepSeek-V4's routed experts as the checkpoint ships them (MXFP4: e2m1 values,
// two a byte, one UE8M0 scale 2^(e - 127) per row and 32 inputs; docs/quantization.md "FP4").
// The weights keep their 4.25 bits: packing only reorders the nibbles into gemm_int4's quad
// layout and puts each tile's exponents behind it. Activations are quantized to INT8 per 1x128
// as in gemm_int8.h.
//
//   Y[m, n] = sum_kb sx[m][kb] / 2 * sum_{sb < 4} ws(e[n][4 kb + sb]) * (D_sb - 12 * S_sb),
//   D_sb = sum_{k in sb} qx[m, k] * u(w[n, k]),   S_sb = sum_{k in sb} qx[m, k]
//
// over the four 32-wide sub-blocks sb of each 128-wide K block. u(w) = 2 * e2m1(w) + 12, an
// unsigned integer in [0, 24] (twice every e2m1 value is an integer in [-12, 12]), so D_sb is an
// exact INT32 dot product and D_sb - 12 S_sb is twice the dot product with the e2m1 values,
// exact (|.| <= 24 * 127 * 32 < 2^24). ws(e) = 2^(e - 127), except ws(0) = 0 (2^-127 times at
// most 6: no weight that small matters, and the SIMD levels build ws from the exponent's bits);
// e = 255 (NaN) is refused when packing. qx, sx: gemm_int8.h's. Per sub-block, in F32: t =
// float(D_sb - 12 S_sb) * ws (exact), h = sx * 0.5 (exact); tot = t * h for the first sub-block
// of the row, fma(t, h, tot) after, in K order. Every level computes exactly this, so the levels
// agree bit for bit and a row's result never depends on M or on the thread split.
//
// Levels: scalar; AVX-512 VNNI (gemm_int4's unpacking, then one vpshufb per 64 weights maps the
// nibbles to u; `vpdpbusd` with the broadcast X; the AVX-512 BF16 level's CPUs run it, and the
// AMX level runs it at every row count: an AMX form is not built). Decode reads 0.53 bytes per
// weight, as the checkpoint holds them. Layouts as gemm_fp8 (dense, grouped contiguous with or
// without gathered rows, grouped masked).
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm_fp8.h"
#include "kernels/weight_view.h"

namespace moeserve {

struct PackedFp4Weight {
  static constexpr int64_t kPanelCols = 64;  // output columns per panel
  static constexpr int64_t kBlockK = 128;    // K per tile
  static constexpr int64_t kSubK = 32;       // K per scale
  static constexpr int64_t kNibbleBytes = kPanelCols * kBlockK / 2;
  static constexpr int64_t kTileBytes = kNibbleBytes + kPanelCols * (kBlockK / kSubK);

  int64_t n = 0, k = 0;
  // Tiles [n_panels][k_blocks], each kTileBytes: the nibbles as gemm_int4.h lays out its quads
  // ([32 k-quads][2][64] bytes), then the exponents [4 sub-blocks][64 columns]. Past N and K:
  // nibbles 0 and exponents 0. 64-byte aligned.
  std::shared_ptr<uint8_t[]> data;

  int64_t n_panels() const { return (n + kPanelCols - 1) / kPanelCols; }
  int64_t k_blocks() const { return (k + kBlockK - 1) / kBlockK; }
  const uint8_t* tile(int64_t panel, int64_t kb) const {
    return data.get() + (panel * k_blocks() + kb) * kTileBytes;
  }
  // The e2m1 code of w[row, col] (0..15) and the exponent e of its 32-wide sub-block.
  uint8_t at(int64_t row, int64_t col) const;
  uint8_t exponent(int64_t row, int64_t col) const {
    return tile(
        row / kPanelCols,
        col / kBlockK)[kNibbleBytes + ((col % kBlockK) / kSubK) * kPanelCols + row % kPanelCols];
  }
  size_t bytes() const { return size_t(n_panels() * k_blocks() * kTileBytes); }
};

// From a checkpoint's FP4 weight (WeightView kF4E2M1, block 1 x 32). K must be a multiple of 32;
// a scale that is not 2^(e - 127) for e in [0, 254] is an InvalidArgument naming `name`.
Result<PackedFp4Weight> pack_fp4_weight(const WeightView& w, const std::string& name);

// x: BF16 bits [m, w.k], row stride ldx. The levels: VNNI where the CPU has AVX-512 BF16 (AMX's
// CPUs too), else scalar.
void gemm_fp4(const uint16_t* x, int64_t m, int64_t ldx, const PackedFp4Weight& w, GemmOutput y,
              ThreadPool* pool, Isa isa = cpu_isa());
void gemm_fp4_grouped_contiguous(const uint16_t* x, int64_t ldx, const int64_t* offsets,
                                 const PackedFp4Weight* const* experts, int64_t n_experts,
                                 GemmOutput y, ThreadPool* pool, Isa isa = cpu_isa());
void gemm_fp4_grouped_contiguous_gather(const uint16_t* x, int64_t ldx, const int32_t* x_rows,
                                        const int64_t* offsets,
                                        const PackedFp4Weight* const* experts, int64_t n_experts,
                                        GemmOutput y, ThreadPool* pool, Isa isa = cpu_isa());
void gemm_fp4_grouped_masked(const uint16_t* x, int64_t ldx, int64_t capacity,
                             const int32_t* counts, const PackedFp4Weight* const* experts,
                             int64_t n_experts, GemmOutput y, ThreadPool* pool,
                             Isa isa = cpu_isa());

}  // namespace moeserve
