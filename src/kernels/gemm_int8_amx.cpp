// gemm_int8 and gemm_int4, AMX level: TDPBSSD on the packed INT8 tiles as they are. A packed
// tile [32 k-quads][64 cols][4] is AMX's B layout for INT8: a 16-column, 64-K slice is one B
// tile with a 256-byte row stride, so nothing is converted; X is quantized per row block into
// tile order [K block][row][128] (an A tile is 16 rows x 64 bytes, rows 128 bytes apart). A
// 128-wide K block is two TDPBSSD per C tile, summed exactly in INT32; the promotion is
// gemm_int8.h's (the same bits as the other levels). INT4 tiles (gemm_int4.h) are unpacked,
// a panel's chunk of K blocks at a time, into that INT8 layout in L2 (their nibbles are the
// unsigned values 0..15: TDPBSUD, X signed times W unsigned) and promoted as gemm_int4.h says;
// each unpacked tile serves every row tile of the call. Calls of few rows run the VNNI code,
// which streams the weights without the tile unit's store-to-load round trips
// (docs/kernels-int8.md).
// The loop follows gemm_fp8_amx.cpp: row blocks, sweeps of panels whose sums stay in L2/L3,
// chunks of K whose X stays in L2, groups of 4 row tiles, blocks of 16 rows x 32 columns in two
// alternating sets of C tiles, each block's promotion after the next block's dot products.
// Compiled with -mavx512{f,bw,vl,dq,bf16,vnni} -mamx-{tile,bf16,int8}; runs only when cpu_isa()
// says so.
#include <immintrin.h>

#include <cstdint>

#include "kernels/gemm_fp8_internal.h"

namespace moeserve::gemm_detail {
namespace {

constexpr int kTileRows = 16;
constexpr int kGroupTiles = 4;             // row tiles a group runs a chunk of K blocks on
constexpr int64_t kChunk = 16;             // most K blocks per chunk with several row groups
constexpr int64_t kXChunkBytes = 1 << 20;  // a chunk's X, kept in L2
constexpr int64_t kSumBytes = 2 << 20;     // a sweep's F32 sums
constexpr int kRing = 4;                   // staging blocks for the tile stores
constexpr int64_t kAhead = 4;              // tiles prefetched ahead with one row group

// Tile registers: sums C 0-1 and C 2-3 (16 rows x 16 columns INT32 each), A 4 and 5 (16 rows x
// 64 bytes of X), B 6-7 (16 k-quads x 16 columns). kInt4: B holds unsigned values (TDPBSUD) and
// the promotion adds the block's minimum times the row's sum of X (gemm_int4.h).
template <bool kInt4>
class BlockPipe {
 public:
  explicit BlockPipe(int32_t* ring) : ring_(ring) {}

  // x: the row tile's quantized X for the K block [16][128]; tile: the INT8 tile; h: the panel
  // half (32 columns); sx and sums [16]: the rows' scales and sums of X; sw [32]: the columns'
  // scales (kInt4: their minimums kPanelCols further on).
  void run(const int8_t* x, const int8_t* tile, int h, const float* sx, const int32_t* sums,
           const float* sw, float* tot, bool first) {
    if (set_ == 0) {
      compute0(x, tile, h);
    } else {
      compute1(x, tile, h);
    }
    drain();
    pending_ = Pending{true, set_, tot, sx, sums, sw, first};
    set_ ^= 1;
  }

  void drain() {
    if (!pending_.valid) return;
    int32_t* c = ring_ + slot_ * kTileRows * 32;
    slot_ = (slot_ + 1) % kRing;
    if (pending_.set == 0) {
      _tile_stored(0, c, 128);
      _tile_stored(1, c + 16, 128);
    } else {
      _tile_stored(2, c, 128);
      _tile_stored(3, c + 16, 128);
    }
    promote(c);
    pending_.valid = false;
  }

 private:
  // INT8: tot[r][0..31] (row stride 64) = (first ? 0 : tot) + (sx[r] * sw) * c[r][0..31].
  // INT4: t = fma(c, sw, mw * sums[r]); tot = first ? t * sx[r] : fma(t, sx[r], tot).
  void promote(const int32_t* c) const {
    const float* sw = pending_.sw;
    const __m512 sw0 = _mm512_loadu_ps(sw), sw1 = _mm512_loadu_ps(sw + 16);
    for (int r = 0; r < kTileRows; ++r) {
      const __m512 vsx = _mm512_set1_ps(pending_.sx[r]);
      for (int j = 0; j < 2; ++j) {
        const __m512 f =
            _mm512_maskz_cvtepi32_ps(__mmask16(0xffff), _mm512_load_si512(c + r * 32 + 16 * j));
        float* d = pending_.tot + r * kPanelCols + 16 * j;
        if constexpr (kInt4) {
          const __m512 mx = _mm512_mul_ps(_mm512_loadu_ps(sw + kPanelCols + 16 * j),
                                          _mm512_set1_ps(float(pending_.sums[r])));
          const __m512 t = _mm512_fmadd_ps(f, j == 0 ? sw0 : sw1, mx);
          _mm512_store_ps(d, pending_.first ? _mm512_mul_ps(t, vsx)
                                            : _mm512_fmadd_ps(t, vsx, _mm512_load_ps(d)));
        } else {
          const __m512 s = _mm512_mul_ps(vsx, j == 0 ? sw0 : sw1);
          _mm512_store_ps(
              d, pending_.first ? _mm512_mul_ps(f, s) : _mm512_fmadd_ps(f, s, _mm512_load_ps(d)));
        }
      }
    }
  }

#define MOESERVE_AMX_INT8_BLOCK(c0, c1, a, DP)                   \
  _tile_zero(c0);                                                \
  _tile_zero(c1);                                                \
  for (int q = 0; q < 2; ++q) { /* 64 K (16 k-quads) per step */ \
    const int8_t* b = tile + q * 16 * 4 * kPanelCols + h * 128;  \
    _tile_loadd(a, x + 64 * q, kBlockK);                         \
    _tile_loadd(6, b, 4 * kPanelCols);                           \
    DP(c0, a, 6);                                                \
    _tile_loadd(7, b + 64, 4 * kPanelCols);                      \
    DP(c1, a, 7);                                                \
  }
  static void compute0(const int8_t* x, const int8_t* tile, int h) {
    if constexpr (kInt4) {
      MOESERVE_AMX_INT8_BLOCK(0, 1, 4, _tile_dpbsud)
    } else {
      MOESERVE_AMX_INT8_BLOCK(0, 1, 4, _tile_dpbssd)
    }
  }
  static void compute1(const int8_t* x, const int8_t* tile, int h) {
    if constexpr (kInt4) {
      MOESERVE_AMX_INT8_BLOCK(2, 3, 5, _tile_dpbsud)
    } else {
      MOESERVE_AMX_INT8_BLOCK(2, 3, 5, _tile_dpbssd)
    }
  }
#undef MOESERVE_AMX_INT8_BLOCK

  struct Pending {
    bool valid = false;
    int set = 0;
    float* tot = nullptr;
    const float* sx = nullptr;
    const int32_t* sums = nullptr;
    const float* sw = nullptr;
    bool first = false;
  };
  int32_t* ring_;
  int slot_ = 0;
  int set_ = 0;
  Pending pending_;
};

// INT4 tiles [from, from + n) (gemm_int4.h: a quad's 128 bytes hold its 256 values as four runs
// of 64 nibbles) to INT8 tiles at dst, values 0..15 in the same places as an INT8 tile's.
void unpack_int4_tiles(const uint8_t* from, int64_t n, int8_t* dst) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int64_t q = 0; q < n * 32; ++q) {
    const __m512i* t = reinterpret_cast<const __m512i*>(from + 128 * q);
    const __m512i a = _mm512_load_si512(t), b = _mm512_load_si512(t + 1);
    auto* d = reinterpret_cast<__m512i*>(dst + 256 * q);
    _mm512_store_si512(d, _mm512_and_si512(a, low));
    _mm512_store_si512(d + 1, _mm512_and_si512(_mm512_srli_epi16(a, 4), low));
    _mm512_store_si512(d + 2, _mm512_and_si512(b, low));
    _mm512_store_si512(d + 3, _mm512_and_si512(_mm512_srli_epi16(b, 4), low));
  }
}

// Lines brought into L2 a few at a time over the calls that follow (a burst of prefetches
// stalls once the miss buffers fill).
struct Prefetcher {
  const char* p = nullptr;
  int64_t left = 0, per_call = 0;
  void start(const char* from, int64_t lines, int64_t calls) {
    p = from;
    left = lines;
    per_call = calls > 0 ? (lines + calls - 1) / calls : lines;
  }
  void step() {
    for (int64_t l = 0; l < per_call && left > 0; ++l, --left, p += 64)
      _mm_prefetch(p, _MM_HINT_T1);
  }
};

template <bool kInt4>
void panels(const GemmJob& job, int64_t p0, int64_t p1) {
  constexpr int64_t tile_bytes = kInt4 ? kTileBytes / 2 : kTileBytes;  // as stored
  constexpr int64_t scale_stride = kInt4 ? 2 * kPanelCols : kPanelCols;
  int64_t mb_max = (12 << 20) / job.k;
  mb_max = mb_max < 96 ? 96 : mb_max > 1024 ? 1024 : mb_max;
  const int64_t m_blocks = (job.m + mb_max - 1) / mb_max;
  int64_t mb_cap = (job.m + m_blocks - 1) / m_blocks;
  if (m_blocks > 1) mb_cap = (mb_cap + kTileRows - 1) / kTileRows * kTileRows;
  const int64_t pad_cap = (mb_cap + kTileRows - 1) / kTileRows * kTileRows;
  const int64_t kbn = job.k_blocks;
  const int64_t n_panels = p1 - p0;
  const auto* wbase = reinterpret_cast<const char*>(job.tiles);
  const char* wend = wbase + p1 * kbn * tile_bytes;

  auto* xq = static_cast<int8_t*>(kept_scratch(kScratchX, size_t(pad_cap * kbn * kBlockK)));
  auto* xs = static_cast<float*>(kept_scratch(kScratchXScale, size_t(pad_cap * kbn * 8)));
  auto* sums = reinterpret_cast<int32_t*>(xs + pad_cap * kbn);
  BlockPipe<kInt4> pipe(static_cast<int32_t*>(kept_scratch(kScratchC, kRing * kTileRows * 32 * 4)));
  Prefetcher pf;

  load_tile_config_16x64();
  for (int64_t m0 = 0; m0 < job.m; m0 += mb_cap) {
    const int64_t mb = job.m - m0 < mb_cap ? job.m - m0 : mb_cap;
    const int64_t mt = (mb + kTileRows - 1) / kTileRows;
    const int64_t rows_pad = mt * kTileRows;
    quantize_rows_int8_avx512(job.x + m0 * job.ldx, job.ldx, mb, rows_pad, job.k, xq, xs, sums);
    const int64_t groups = (mt + kGroupTiles - 1) / kGroupTiles;
    int64_t chunk = kXChunkBytes / (rows_pad * kBlockK);
    chunk = chunk < 1 ? 1 : chunk > kbn ? kbn : chunk;
    if (groups > 1 && chunk > kChunk) chunk = kChunk;
    int64_t sweep = chunk == kbn ? 1 : kSumBytes / (rows_pad * kPanelCols * 4);
    sweep = sweep < 1 ? 1 : sweep > n_panels ? n_panels : sweep;
    float* tot =
        static_cast<float*>(kept_scratch(kScratchTot, size_t(sweep * rows_pad * kPanelCols * 4)));
    int8_t* unpacked = nullptr;  // kInt4: a panel's chunk of tiles in the INT8 layout
    if constexpr (kInt4) {
      unpacked = static_cast<int8_t*>(kept_scratch(kScratchTiles, size_t(chunk * kTileBytes)));
    }

    for (int64_t s0 = p0; s0 < p1; s0 += sweep) {
      const int64_t s1 = s0 + sweep < p1 ? s0 + sweep : p1;
      for (int64_t kb0 = 0; kb0 < kbn; kb0 += chunk) {
        const int64_t kb1 = kb0 + chunk < kbn ? kb0 + chunk : kbn;
        for (int64_t p = s0; p < s1; ++p) {
          float* ptot = tot + (chunk == kbn ? 0 : (p - s0) * rows_pad * kPanelCols);
          // With several groups the later ones run on tiles already in L2 and bring the next
          // panel's chunk; with one, each K block brings the tile kAhead on.
          if (groups > 1 && p + 1 < s1) {
            pf.start(wbase + ((p + 1) * kbn + kb0) * tile_bytes, (kb1 - kb0) * tile_bytes / 64,
                     (groups - 1) * (kb1 - kb0) * (2 * kGroupTiles));
          }
          if constexpr (kInt4) {
            unpack_int4_tiles(job.tiles + (p * kbn + kb0) * tile_bytes, kb1 - kb0, unpacked);
          }
          for (int64_t g = 0; g < groups; ++g) {
            const int64_t t0 = g * kGroupTiles, t1 = t0 + kGroupTiles < mt ? t0 + kGroupTiles : mt;
            for (int64_t kb = kb0; kb < kb1; ++kb) {
              const char* src = wbase + (p * kbn + kb) * tile_bytes;
              if (groups == 1) {
                const char* a = src + kAhead * tile_bytes;
                if (a < wend) pf.start(a, tile_bytes / 64, 2 * (t1 - t0));
              }
              const auto* tile =
                  kInt4 ? unpacked + (kb - kb0) * kTileBytes : reinterpret_cast<const int8_t*>(src);
              const float* sw = job.scales + (p * kbn + kb) * scale_stride;
              const int8_t* xk = xq + kb * rows_pad * kBlockK;
              const float* sxk = xs + kb * rows_pad;
              const int32_t* sumk = sums + kb * rows_pad;
              for (int64_t t = t0; t < t1; ++t) {
                for (int h = 0; h < 2; ++h) {
                  if (groups == 1 || g > 0) pf.step();
                  pipe.run(xk + t * kTileRows * kBlockK, tile, h, sxk + t * kTileRows,
                           sumk + t * kTileRows, sw + 32 * h,
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

void panels_int8_amx(const GemmJob& job, int64_t p0, int64_t p1) {
  if (job.m <= kInt8VnniMaxRows) {
    panels_int8_vnni(job, p0, p1);
    return;
  }
  panels<false>(job, p0, p1);
}

void panels_int4_amx(const GemmJob& job, int64_t p0, int64_t p1) {
  if (job.m <= kInt8VnniMaxRows) {
    panels_int4_vnni(job, p0, p1);
    return;
  }
  panels<true>(job, p0, p1);
}

}  // namespace moeserve::gemm_detail
