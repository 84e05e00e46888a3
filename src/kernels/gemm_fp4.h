// FP4 GEMMs for DeepSeek-V4's routed experts as the checkpoint ships them (MXFP4: e2m1 values,
// two a byte, one UE8M0 scale 2^(e - 127) per row and 32 inputs; docs/quantization.md "FP4").
// The weights keep their 4.25 bits and their values: packing only reorders the nibbles and puts
// each tile's exponents behind it; the kernels widen the nibbles to BF16 in registers (every e2m1
// value is a BF16 value) and take BF16 activations as gemm_fp8 does, so nothing is rounded on the
// way but the F32 sums.
//
//   Y[m, n] = sum over the 32-wide sub-blocks sb of K, in order, of ws(e[n][sb]) * S_sb,
//   S_sb = sum over the k-pairs (k, k + 1) of sb, in order, of
//          x[m, k + 1] * v(w[n, k + 1]) then x[m, k] * v(w[n, k]), each an F32 fused add
//
// v: the e2m1 value of a code; ws(e) = 2^(e - 127), except ws(0) = 0 (2^-127 times at most 6: no
// weight that small matters, and the SIMD level builds ws from the exponent's bits); e = 255 (NaN)
// is refused when packing. Per sub-block: tot = S_sb * ws for the first of the row, fma(S_sb, ws,
// tot) after. The order within a pair is `vdpbf16ps`'s (odd element first; each product of two
// BF16 values is exact in F32), so the levels agree bit for bit and a row's result never depends
// on M or on the thread split (inputs whose products or sums are F32 subnormals excepted: the
// SIMD level flushes those, as vdpbf16ps does).
//
// Levels: scalar; AVX-512 BF16 (per 64 packed bytes, two masks and a shift give 128 nibble
// indices, four vpshufb look up the BF16 values' low and high bytes and four byte unpacks
// interleave them into the [16 columns][2 k] pairs vdpbf16ps takes; the AMX level's CPUs run it
// at every row count: an AMX form is not built). Decode reads 0.53 bytes per weight, as the
// checkpoint holds them. Layouts as gemm_fp8 (dense, grouped contiguous with or without gathered
// rows, grouped masked).
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
  // Tiles [n_panels][k_blocks], each kTileBytes: the nibbles, 64 bytes per k-pair (byte_of says
  // where each lies), then the exponents [4 sub-blocks][64 columns]. Past N and K: nibbles 0 and
  // exponents 0. 64-byte aligned.
  std::shared_ptr<uint8_t[]> data;

  int64_t n_panels() const { return (n + kPanelCols - 1) / kPanelCols; }
  int64_t k_blocks() const { return (k + kBlockK - 1) / kBlockK; }
  const uint8_t* tile(int64_t panel, int64_t kb) const {
    return data.get() + (panel * k_blocks() + kb) * kTileBytes;
  }
  // Where value (c, kk) of a tile lies (column c of the panel, kk in the K block): its byte and
  // nibble (shift 0 or 4). The 64 bytes of k-pair p: column group j = c / 16 takes the low
  // (j < 2) or high nibbles of the bytes 16 l + 8 (j % 2) + b, word w = 2 (c % 16) + kk % 2 = 8 l
  // + b of the group's 32 BF16 values: what the byte unpacks of the AVX-512 level produce.
  static void byte_of(int64_t c, int64_t kk, int64_t* byte, int* shift);
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

// x: BF16 bits [m, w.k], row stride ldx. The levels: AVX-512 BF16 where the CPU has it (AMX's
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
