// gemm_fp8, AMX level: the same packed tiles feed Intel's tile unit. A packed tile
// [64 k-pairs][64 cols][2] is already AMX's B layout (VNNI pairs): a 16-column, 32-K slice of
// it is one B tile with a 256-byte row stride, so BF16 weights (the lm_head) are read in place
// and FP8 tiles need only the exact byte-lookup conversion of the AVX-512 BF16 level, once per
// tile and row block, into a BF16 copy that stays in L1/L2 while every row of the block uses it.
// TDPBF16PS sums a 128-wide K block in F32 tiles; each block's sums are scaled and added in
// F32 (DeepGEMM's promotion per 128 K: the tile unit never holds a scaled sum), so a row's
// result does not depend on the rows beside it or on M. docs/kernels-amx.md has the layouts
// and the measurements behind the choices.
// Compiled with -mavx512{f,bw,vl,dq,bf16} -mamx-{tile,bf16,int8}; runs only when cpu_isa() says so.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm_fp8_internal.h"

namespace moeserve::gemm_detail {
namespace {

constexpr int kTileRows = 16;   // rows of an A or C tile
constexpr int kGroupTiles = 4;  // row tiles a group runs a chunk of K blocks on (64 rows)
constexpr int64_t kChunk = 16;  // most K blocks per chunk with several row groups (256 KB of tiles)
constexpr int64_t kXChunkBytes = 1 << 20;  // a chunk's X, kept in L2
constexpr int64_t kSumBytes = 2 << 20;     // a sweep's F32 sums
constexpr int kRing = 4;                   // staging blocks for the tile stores
constexpr int64_t kAhead = 16;             // FP8 tiles prefetched ahead with one row group
constexpr int64_t kAheadBf16 = 8;          // BF16 tiles (16 KB each) the same

// Tile registers: two sets of sums, C 0-1 and C 2-3 (each 16 rows x 32 columns F32), A 4 and 5
// (16 rows x 32 BF16 of X, one per set), B 6-7 (16 k-pairs x 16 columns each). All eight are
// 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// tot[r][0..31] (row stride 64) = (first ? 0 : tot) + s * c[r][0..31], r < 16; c [16][32].
inline void promote(const float* c, float s, float* tot, bool first) {
  const __m512 vs = _mm512_set1_ps(s);
  for (int r = 0; r < kTileRows; ++r) {
    for (int j = 0; j < 2; ++j) {
      const __m512 v = _mm512_load_ps(c + r * 32 + 16 * j);
      float* d = tot + r * kPanelCols + 16 * j;
      _mm512_store_ps(d, first ? _mm512_mul_ps(v, vs) : _mm512_fmadd_ps(v, vs, _mm512_load_ps(d)));
    }
  }
}

// The unit of work: one row tile's 16 rows x 32 columns (half h of a panel) over one 128-wide
// K block. Blocks alternate between the two sets of sum tiles, and a block's sums are stored
// and promoted only after the next block's dot products are issued: the tile unit runs in
// order, so a store right after its own dot products would leave the unit idle for their
// latency (measured: 0.77 of the unit's peak with one set of four tiles, 0.92 with two of
// two; docs/kernels-amx.md).
class BlockPipe {
 public:
  explicit BlockPipe(float* ring) : ring_(ring) {}

  // x: the row tile's X for the K block [16][128]; tile: the BF16 packed tile.
  void run(const uint16_t* x, const uint16_t* tile, int h, float scale, float* tot, bool first) {
    if (set_ == 0) {
      compute0(x, tile, h);
    } else {
      compute1(x, tile, h);
    }
    drain();
    pending_ = Pending{true, set_, tot, scale, first};
    set_ ^= 1;
  }

  // Stores and promotes the last block (before its sums are read).
  void drain() {
    if (!pending_.valid) return;
    float* c = ring_ + slot_ * kTileRows * 32;
    slot_ = (slot_ + 1) % kRing;
    if (pending_.set == 0) {
      _tile_stored(0, c, 128);
      _tile_stored(1, c + 16, 128);
    } else {
      _tile_stored(2, c, 128);
      _tile_stored(3, c + 16, 128);
    }
    promote(c, pending_.scale, pending_.tot, pending_.first);
    pending_.valid = false;
  }

 private:
  // The tile intrinsics name their registers by literal number: one body, instantiated per set
  // (sums c0, c1; X tile a).
#define MOESERVE_AMX_BLOCK(c0, c1, a)                            \
  _tile_zero(c0);                                                \
  _tile_zero(c1);                                                \
  for (int q = 0; q < 4; ++q) { /* 32 K (16 k-pairs) per step */ \
    const uint16_t* b = tile + q * 16 * 2 * kPanelCols + h * 64; \
    _tile_loadd(a, x + 32 * q, kBlockK * 2);                     \
    _tile_loadd(6, b, 4 * kPanelCols);                           \
    _tile_dpbf16ps(c0, a, 6);                                    \
    _tile_loadd(7, b + 32, 4 * kPanelCols);                      \
    _tile_dpbf16ps(c1, a, 7);                                    \
  }
  static void compute0(const uint16_t* x, const uint16_t* tile, int h) {
    MOESERVE_AMX_BLOCK(0, 1, 4)
  }
  static void compute1(const uint16_t* x, const uint16_t* tile, int h) {
    MOESERVE_AMX_BLOCK(2, 3, 5)
  }
#undef MOESERVE_AMX_BLOCK

  struct Pending {
    bool valid = false;
    int set = 0;
    float* tot = nullptr;
    float scale = 1;
    bool first = false;
  };
  float* ring_;
  int slot_ = 0;
  int set_ = 0;
  Pending pending_;
};

void panels(const GemmJob& job, int64_t p0, int64_t p1) {
  // Rows per block, as at the AVX-512 level: X's block stays in L3 while every panel passes.
  int64_t mb_max = (12 << 20) / (2 * job.k);
  mb_max = mb_max < 96 ? 96 : mb_max > 1024 ? 1024 : mb_max;
  const int64_t m_blocks = (job.m + mb_max - 1) / mb_max;
  int64_t mb_cap = (job.m + m_blocks - 1) / m_blocks;
  if (m_blocks > 1) mb_cap = (mb_cap + kTileRows - 1) / kTileRows * kTileRows;
  const int64_t mt_cap = (mb_cap + kTileRows - 1) / kTileRows;  // row tiles per block
  const int64_t kbn = job.k_blocks, last = kbn - 1;
  const int64_t xt_elems = kTileRows * kBlockK;  // one row tile's K block: 4 KB
  const int64_t n_panels = p1 - p0;
  const int64_t tile_bytes = job.bf16_tiles ? 2 * kTileBytes : kTileBytes;
  const char* wbase = reinterpret_cast<const char*>(job.tiles);
  const char* wend = wbase + p1 * kbn * tile_bytes;  // past this call's last tile

  // The block's X in tile order [K block][row tile][16][128], zero past M and K (a tile's rows
  // 256 bytes apart; X's own rows are 14 KB apart at V3's K: 16 of them on 2 cache sets);
  // the staging ring for the tile stores.
  uint16_t* xp = static_cast<uint16_t*>(kept_scratch(kScratchX, mt_cap * kbn * xt_elems * 2));
  BlockPipe pipe(static_cast<float*>(kept_scratch(kScratchC, kRing * kTileRows * 32 * 4)));

  load_tile_config_16x64();
  for (int64_t m0 = 0; m0 < job.m; m0 += mb_cap) {
    const int64_t mb = job.m - m0 < mb_cap ? job.m - m0 : mb_cap;
    const int64_t mt = (mb + kTileRows - 1) / kTileRows;
    const int64_t rows_pad = mt * kTileRows;
    const uint16_t* xblk = job.x + m0 * job.ldx;
    for (int64_t kb = 0; kb < kbn; ++kb) {
      const int64_t cols = kb == last ? job.k - last * kBlockK : kBlockK;
      for (int64_t row = 0; row < rows_pad; ++row) {
        uint16_t* d = xp + (kb * mt + row / kTileRows) * xt_elems + (row % kTileRows) * kBlockK;
        if (row < mb) {
          std::memcpy(d, xblk + row * job.ldx + kb * kBlockK, size_t(cols) * 2);
          if (cols < kBlockK) std::memset(d + cols, 0, size_t(kBlockK - cols) * 2);
        } else {
          std::memset(d, 0, kBlockK * 2);
        }
      }
    }
    // A chunk of K blocks: its X (every row of the block) stays in L2 while the panels of a
    // sweep pass over it, so X comes from L3 once per chunk and sweep, not once per panel (the
    // tile unit reads 64 flops' worth of X per byte: at its rate, more than L3 gives a core).
    const int64_t groups = (mt + kGroupTiles - 1) / kGroupTiles;
    int64_t chunk = kXChunkBytes / (rows_pad * kBlockK * 2);
    chunk = chunk < 1 ? 1 : chunk > kbn ? kbn : chunk;
    if (groups > 1 && chunk > kChunk) chunk = kChunk;
    // Converted tiles: one panel's chunk when several row groups read them, else two in turn.
    const int64_t ct_slots = groups == 1 ? 2 : chunk;
    uint16_t* ctiles = job.bf16_tiles ? nullptr
                                      : static_cast<uint16_t*>(kept_scratch(
                                            kScratchTiles, size_t(2 * kTileBytes * ct_slots)));
    // Panels per sweep: their sums stay in L2/L3 between chunks (one sweep when K is one chunk).
    int64_t sweep = chunk == kbn ? 1 : kSumBytes / (rows_pad * kPanelCols * 4);
    sweep = sweep < 1 ? 1 : sweep > n_panels ? n_panels : sweep;
    float* tot =
        static_cast<float*>(kept_scratch(kScratchTot, size_t(sweep * rows_pad * kPanelCols * 4)));

    for (int64_t s0 = p0; s0 < p1; s0 += sweep) {
      const int64_t s1 = s0 + sweep < p1 ? s0 + sweep : p1;
      for (int64_t kb0 = 0; kb0 < kbn; kb0 += chunk) {
        const int64_t kb1 = kb0 + chunk < kbn ? kb0 + chunk : kbn;
        for (int64_t p = s0; p < s1; ++p) {
          float* ptot = tot + (chunk == kbn ? 0 : (p - s0) * rows_pad * kPanelCols);
          // The weights the first group reads next come from DRAM: ask for them early, into
          // L2. With one group, a few tiles ahead inside the loop; with several, the next
          // panel's chunk (contiguous after this one's), spread over the later groups' calls,
          // which run on tiles already converted and leave DRAM idle.
          const char* next = nullptr;
          int64_t next_lines = 0, per_call = 0;
          if (groups > 1 && p + 1 < s1) {
            next = wbase + ((p + 1) * kbn + kb0) * tile_bytes;
            next_lines = (kb1 - kb0) * tile_bytes / 64;
            const int64_t calls = (groups - 1) * (kb1 - kb0);
            per_call = (next_lines + calls - 1) / calls;
          }
          int64_t call = 0;
          auto ctile = [&](int64_t kb) {
            return ctiles + (groups == 1 ? (kb & 1) : kb - kb0) * kTileBytes;
          };
          for (int64_t g = 0; g < groups; ++g) {
            const int64_t t0 = g * kGroupTiles, t1 = t0 + kGroupTiles < mt ? t0 + kGroupTiles : mt;
            for (int64_t kb = kb0; kb < kb1; ++kb) {
              const char* src = wbase + (p * kbn + kb) * tile_bytes;
              // With one group the FP8 tiles a few on are prefetched inside the conversion
              // (a burst of 128 prefetches stalls once the miss buffers fill); BF16 tiles, read
              // in place, every line of the tile kAheadBf16 on, a share before each block (every
              // 4th line in one burst read the lm_head at 13-14 GB/s at 4-32 rows, this 17-21).
              const uint8_t* ahead = nullptr;
              const char* bf16_ahead = nullptr;  // BF16 tiles: spread over this tile's blocks
              if (groups == 1) {
                const char* a = src + (job.bf16_tiles ? kAheadBf16 : kAhead) * tile_bytes;
                if (a < wend) ahead = reinterpret_cast<const uint8_t*>(a);
                if (ahead && job.bf16_tiles) bf16_ahead = a;
              } else if (g > 0 && next) {
                const int64_t l0 = call * per_call;
                for (int64_t l = l0; l < l0 + per_call && l < next_lines; ++l)
                  _mm_prefetch(next + 64 * l, _MM_HINT_T1);
                ++call;
              }
              const uint16_t* tile;
              float scale = 1.0f;
              if (job.bf16_tiles) {
                tile = reinterpret_cast<const uint16_t*>(src);
              } else {
                // The first group converts the tile right before its dot products; the later
                // groups find it in L2. (Converting one K block ahead, to overlap the vector
                // unit with the tile unit, ran decode at half the speed: the conversion's
                // stores retire only after the tile instructions before them, and fill the
                // store buffer; docs/kernels-amx.md.) With one group two slots take turns.
                if (g == 0)
                  convert_tile_bf16(reinterpret_cast<const uint8_t*>(src), ctile(kb), ahead);
                tile = ctile(kb);
                scale = job.scales[(p / 2) * kbn + kb];
              }
              const uint16_t* xk = xp + kb * mt * xt_elems;
              const int64_t pf_lines = tile_bytes / 64, pf_per_run = pf_lines / (2 * (t1 - t0));
              int64_t pf_line = 0;
              for (int64_t t = t0; t < t1; ++t) {
                for (int h = 0; h < 2; ++h) {
                  if (bf16_ahead) {
                    const int64_t end = t + 1 == t1 && h == 1 ? pf_lines : pf_line + pf_per_run;
                    for (; pf_line < end; ++pf_line)
                      _mm_prefetch(bf16_ahead + 64 * pf_line, _MM_HINT_T1);
                  }
                  pipe.run(xk + t * xt_elems, tile, h, scale,
                           ptot + t * kTileRows * kPanelCols + 32 * h, kb == 0);
                }
              }
            }
          }
          if (kb1 == kbn) {
            pipe.drain();
            store_panel_rows(ptot, mb, job.y, job.ldy, m0, p * kPanelCols, job.n, job.y_bf16);
          }
        }
      }
    }
  }
  pipe.drain();
  _tile_release();
}

}  // namespace

void load_tile_config_16x64() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = kTileRows;
  }
  // GCC 12 does not see that LDTILECFG reads all 64 bytes and may drop the stores to the
  // fields (a miscompile we met in a test program): make them happen first.
  __asm__ volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

void panels_amx(const GemmJob& job, int64_t p0, int64_t p1) {
  // One row (batch-1 decode): the tile unit would wait on each converted tile's stores; the
  // vector code gives the same bits (docs/kernels-amx.md).
  if (job.m <= kAmxVectorMaxRows) {
    panels_avx512bf16_amx_sums(job, p0, p1);
    return;
  }
  panels(job, p0, p1);
}

}  // namespace moeserve::gemm_detail
