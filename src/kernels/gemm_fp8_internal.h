// Internal to gemm_fp8: the unit of work every ISA level implements. Plain data only, and this
// header includes nothing that carries inline code (see cpu_features.h on why ISA files share
// no inline code with the rest of the program).
#pragma once

#include <cstddef>
#include <cstdint>

namespace moeserve::gemm_detail {

constexpr int64_t kPanelCols = 64;  // = PackedFp8Weight::kPanelCols
constexpr int64_t kBlockK = 128;
constexpr int64_t kTileBytes = kPanelCols * kBlockK;

// Rows [0, m) of X times panels [p0, p1) of W, written to the matching columns of Y.
// Tile (p, kb) is at tiles + (p * k_blocks + kb) * kTileBytes, laid out [64 k-pairs][64 cols][2];
// its scale is scales[(p / 2) * k_blocks + kb].
struct GemmJob {
  const uint16_t* x;  // BF16 [m, k], row stride ldx (gemm_fp8); null for the f32x variants
  int64_t m, ldx;
  const uint8_t* tiles;
  const float* scales;
  int64_t n, k, k_blocks;
  void* y;  // [m, n], row stride ldy, F32 or BF16
  bool y_bf16;
  int64_t ldy;
  const float* xf;  // F32 [m, k], row stride ldx (gemm_fp8_f32x); null for the BF16 variants
  bool bf16_tiles = false;  // tiles hold BF16 (PackedBf16Weight, 2 * kTileBytes each), no scales
  // Gathered rows (BF16 x only): row i of the job is x + x_rows[i] * ldx. The ISA levels never
  // see it: gemm_fp8.cpp copies a job's rows together before handing the job on.
  const int32_t* x_rows = nullptr;
};

void panels_scalar(const GemmJob& job, int64_t p0, int64_t p1);
void panels_avx2(const GemmJob& job, int64_t p0, int64_t p1);
void panels_avx512(const GemmJob& job, int64_t p0, int64_t p1);
void panels_avx512bf16(const GemmJob& job, int64_t p0, int64_t p1);  // also BF16 tiles
void panels_amx(const GemmJob& job, int64_t p0, int64_t p1);         // also BF16 tiles

// Shared by the AVX-512 BF16 and AMX levels (defined in gemm_fp8_avx512.cpp, which both levels'
// CPUs run):
// - a per-thread buffer of at least `bytes`, 64-byte aligned, kept between calls (slot < 8;
//   one slot per buffer a call holds at once);
// - one packed FP8 tile to BF16 in the same layout, exactly (dst 64-byte aligned), bringing the
//   kTileBytes from `prefetch` (if not null) into L2 on the way, one line per 64 bytes converted;
// - rows [0, rows) of a panel's F32 sums tot [rows][64] to Y's rows row0.. and columns col0..
//   (only those below n), F32 or BF16 rounded to nearest even.
constexpr int kScratchSlots = 8;
enum ScratchSlot : int { kScratchTiles, kScratchTot, kScratchTail, kScratchX, kScratchC };
void* kept_scratch(int slot, size_t bytes);
void convert_tile_bf16(const uint8_t* src, uint16_t* dst, const uint8_t* prefetch);
void store_panel_rows(const float* tot, int64_t rows, void* y, int64_t ldy, int64_t row0,
                      int64_t col0, int64_t n, bool y_bf16);

// The F32-activation levels (gemm_fp8_f32x): read job.xf instead of job.x.
void panels_f32x_scalar(const GemmJob& job, int64_t p0, int64_t p1);
void panels_f32x_avx2(const GemmJob& job, int64_t p0, int64_t p1);
void panels_f32x_avx512(const GemmJob& job, int64_t p0, int64_t p1);

}  // namespace moeserve::gemm_detail
