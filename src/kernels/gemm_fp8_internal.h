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
  // tiles hold INT8 (PackedInt8Weight: [32 k-quads][64 cols][4], kTileBytes each) and scales
  // the per-column group scales [n_panels][k_blocks][64]; X is quantized by the level.
  bool int8_tiles = false;
  // Gathered rows (BF16 x only): row i of the job is x + x_rows[i] * ldx. The ISA levels never
  // see it: gemm_fp8.cpp copies a job's rows together before handing the job on.
  const int32_t* x_rows = nullptr;
};

void panels_scalar(const GemmJob& job, int64_t p0, int64_t p1);
void panels_avx2(const GemmJob& job, int64_t p0, int64_t p1);
void panels_avx512(const GemmJob& job, int64_t p0, int64_t p1);
void panels_avx512bf16(const GemmJob& job, int64_t p0, int64_t p1);  // also BF16 tiles
void panels_amx(const GemmJob& job, int64_t p0, int64_t p1);         // also BF16 tiles
// The AVX-512 BF16 code summing each K block as TDPBF16PS does (the same bits as panels_amx):
// what the AMX level runs for one-row jobs (batch-1 decode), where it is faster than the tile
// unit; it takes any number of rows.
void panels_avx512bf16_amx_sums(const GemmJob& job, int64_t p0, int64_t p1);
constexpr int64_t kAmxVectorMaxRows = 1;

// AMX (defined in gemm_fp8_amx.cpp): every tile register 16 rows x 64 bytes, palette 1.
void load_tile_config_16x64();

// The INT8 levels (gemm_int8.h): every one gives the same bits.
void panels_int8_scalar(const GemmJob& job, int64_t p0, int64_t p1);
void panels_int8_vnni(const GemmJob& job, int64_t p0, int64_t p1);  // AVX-512 VNNI
void panels_int8_amx(const GemmJob& job, int64_t p0, int64_t p1);   // VNNI at few rows
// The INT4 levels (gemm_int4.h): tiles are PackedInt4Weight's, scales its [2][64] per block.
void panels_int4_scalar(const GemmJob& job, int64_t p0, int64_t p1);
void panels_int4_vnni(const GemmJob& job, int64_t p0, int64_t p1);  // AVX-512 VNNI
void panels_int4_amx(const GemmJob& job, int64_t p0, int64_t p1);   // VNNI at few rows
// The scalar levels' store of one result: Y[row, col] = v, F32 or BF16 rounded to nearest even
// (defined in gemm_int8.cpp).
void store_scalar(const GemmJob& job, int64_t row, int64_t col, float v);
// The FP4 levels (gemm_fp4.h): tiles are PackedFp4Weight's (exponents inside), no scales; x BF16.
void panels_fp4_scalar(const GemmJob& job, int64_t p0, int64_t p1);
void panels_fp4_avx512bf16(const GemmJob& job, int64_t p0, int64_t p1);
// Jobs of at most this many rows run the VNNI code at the AMX level.
constexpr int64_t kInt8VnniMaxRows = 16;

// Rows [0, rows) of x (BF16, row stride ldx, k columns) quantized per 128-wide K block as
// gemm_int8.h says, into q [k_blocks][rows_pad][128] (rows_pad >= rows; rows past `rows` and
// columns past k are zero), sx and sums (the sum of the block's q) [k_blocks][rows_pad].
// Defined by the scalar level and by the VNNI level (which the AMX level shares); the same bits.
void quantize_rows_int8_scalar(const uint16_t* x, int64_t ldx, int64_t rows, int64_t rows_pad,
                               int64_t k, int8_t* q, float* sx, int32_t* sums);
void quantize_rows_int8_avx512(const uint16_t* x, int64_t ldx, int64_t rows, int64_t rows_pad,
                               int64_t k, int8_t* q, float* sx, int32_t* sums);

// Shared by the AVX-512 BF16 and AMX levels (defined in gemm_fp8_avx512.cpp, which both levels'
// CPUs run):
// - a per-thread buffer of at least `bytes`, 64-byte aligned, kept between calls (slot < 8;
//   one slot per buffer a call holds at once);
// - one packed FP8 tile to BF16 in the same layout, exactly (dst 64-byte aligned), bringing the
//   kTileBytes from `prefetch` (if not null) into L2 on the way, one line per 64 bytes converted;
// - rows [0, rows) of a panel's F32 sums tot [rows][64] to Y's rows row0.. and columns col0..
//   (only those below n), F32 or BF16 rounded to nearest even.
constexpr int kScratchSlots = 8;
enum ScratchSlot : int {
  kScratchTiles,
  kScratchTot,
  kScratchTail,
  kScratchX,
  kScratchC,
  kScratchXScale,  // INT8: the quantized X's scales and sums
  kScratchXSplit,  // AMX sums at the AVX-512 BF16 level: X's split pairs
};
void* kept_scratch(int slot, size_t bytes);
void convert_tile_bf16(const uint8_t* src, uint16_t* dst, const uint8_t* prefetch);
void store_panel_rows(const float* tot, int64_t rows, void* y, int64_t ldy, int64_t row0,
                      int64_t col0, int64_t n, bool y_bf16);

// The F32-activation levels (gemm_fp8_f32x): read job.xf instead of job.x.
void panels_f32x_scalar(const GemmJob& job, int64_t p0, int64_t p1);
void panels_f32x_avx2(const GemmJob& job, int64_t p0, int64_t p1);
void panels_f32x_avx512(const GemmJob& job, int64_t p0, int64_t p1);

}  // namespace moeserve::gemm_detail
