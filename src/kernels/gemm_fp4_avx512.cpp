// gemm_fp4, AVX-512 BF16 level (gemm_fp4.h; the AMX level's CPUs run it too). Per 64 packed
// bytes (one k-pair of a 64-column panel): a mask and a shift split the 128 nibbles into two
// vectors of indices; vpshufb looks up the low and the high byte of each e2m1 value's BF16 bits
// and the byte unpacks interleave them into four vectors of [16 columns][2 k] BF16 pairs, which
// vdpbf16ps multiplies with the broadcast pair of X. Each 32-wide sub-block sums into fresh F32
// accumulators that are then scaled by the sub-block's 2^(e - 127) (built from the exponent's
// bits) into the panel's totals: the order gemm_fp4.h states, so the scalar level's bits.
// Compiled with -mavx512{f,bw,vl,dq,bf16,vbmi,vnni}; runs only when cpu_isa() says so.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm_fp8_internal.h"

namespace moeserve::gemm_detail {
namespace {

constexpr int kRows = 6;        // register block: 6 rows x 4 zmm (64 columns) of F32 sums
constexpr int64_t kChunk = 16;  // K blocks a row block runs in turn (68 KB of tiles, in L2)
constexpr int64_t kAhead = 4;   // tiles prefetched ahead by the first row block (into L2)
constexpr int64_t kNibbleBytes = kTileBytes / 2;
constexpr int64_t kFp4TileBytes = kNibbleBytes + 4 * kPanelCols;  // PackedFp4Weight::kTileBytes

// One K block of R rows: x [R][128] BF16 (row stride 128, zero past K), the tile; tot [R][64]
// set (first) or updated. pf: a tile to bring into L2 on the way (or null).
template <int R>
__attribute__((noinline)) void micro(const uint16_t* x, const uint8_t* tile, float* tot, bool first,
                                     const char* pf) {
  const __mmask16 all = 0xffff;  // (zero-masked forms: the unmasked ones trip GCC 12's
                                 // -Wuninitialized)
  const __m512i low = _mm512_set1_epi8(0x0f);
  // The BF16 bits of e2m1 codes 0..15: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
  const __m512i lut_lo = _mm512_maskz_broadcast_i32x4(
      all, _mm_setr_epi8(0, 0, char(0x80), char(0xc0), 0, 0x40, char(0x80), char(0xc0), 0, 0,
                         char(0x80), char(0xc0), 0, 0x40, char(0x80), char(0xc0)));
  const __m512i lut_hi = _mm512_maskz_broadcast_i32x4(
      all, _mm_setr_epi8(0, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40, char(0x80), char(0xbf),
                         char(0xbf), char(0xbf), char(0xc0), char(0xc0), char(0xc0), char(0xc0)));
  for (int sb = 0; sb < 4; ++sb) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
    }
    for (int p = 16 * sb; p < 16 * sb + 16; ++p) {
      if (pf) _mm_prefetch(pf + 64 * p, _MM_HINT_T1);
      const __m512i v = _mm512_load_si512(tile + 64 * p);
      const __m512i a = _mm512_and_si512(v, low);
      const __m512i b = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      const __m512i al = _mm512_shuffle_epi8(lut_lo, a), ah = _mm512_shuffle_epi8(lut_hi, a);
      const __m512i bl = _mm512_shuffle_epi8(lut_lo, b), bh = _mm512_shuffle_epi8(lut_hi, b);
      const __m512bh w0 = (__m512bh)_mm512_unpacklo_epi8(al, ah);
      const __m512bh w1 = (__m512bh)_mm512_unpackhi_epi8(al, ah);
      const __m512bh w2 = (__m512bh)_mm512_unpacklo_epi8(bl, bh);
      const __m512bh w3 = (__m512bh)_mm512_unpackhi_epi8(bl, bh);
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, x + r * kBlockK + 2 * p, 4);
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w0, xb);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w1, xb);
        acc[r][2] = _mm512_dpbf16_ps(acc[r][2], w2, xb);
        acc[r][3] = _mm512_dpbf16_ps(acc[r][3], w3, xb);
      }
    }
    if (pf) _mm_prefetch(pf + kNibbleBytes + 64 * sb, _MM_HINT_T1);
    __m512 ws[4];  // 2^(e - 127) from the exponent's bits; e = 0 gives 0
    for (int j = 0; j < 4; ++j) {
      const __m128i e =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + kNibbleBytes + 64 * sb + 16 * j));
      ws[j] =
          _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu8_epi32(all, e), 23));
    }
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < 4; ++j) {
        float* d = tot + r * kPanelCols + 16 * j;
        _mm512_store_ps(d, first && sb == 0 ? _mm512_mul_ps(acc[r][j], ws[j])
                                            : _mm512_fmadd_ps(acc[r][j], ws[j], _mm512_load_ps(d)));
      }
    }
  }
}

void micro_rows(int rows, const uint16_t* x, const uint8_t* tile, float* tot, bool first,
                const char* pf) {
  switch (rows) {
    case 6:
      return micro<6>(x, tile, tot, first, pf);
    case 5:
      return micro<5>(x, tile, tot, first, pf);
    case 4:
      return micro<4>(x, tile, tot, first, pf);
    case 3:
      return micro<3>(x, tile, tot, first, pf);
    case 2:
      return micro<2>(x, tile, tot, first, pf);
    default:
      return micro<1>(x, tile, tot, first, pf);
  }
}

}  // namespace

void panels_fp4_avx512bf16(const GemmJob& job, int64_t p0, int64_t p1) {
  // Rows per block: the block's X (mb x K BF16, K padded to 128) stays in L3 while every panel
  // passes over it.
  int64_t mb_max = (6 << 20) / job.k;
  mb_max = mb_max < 96 ? 96 : mb_max > 1024 ? 1024 : mb_max;
  const int64_t m_blocks = (job.m + mb_max - 1) / mb_max;
  int64_t mb_cap = (job.m + m_blocks - 1) / m_blocks;
  if (m_blocks > 1) mb_cap = (mb_cap + kRows - 1) / kRows * kRows;
  const int64_t kbn = job.k_blocks;
  const int64_t chunk = kbn < kChunk ? kbn : kChunk;
  auto* xp = static_cast<uint16_t*>(kept_scratch(kScratchX, size_t(mb_cap * kbn * kBlockK * 2)));
  auto* tot = static_cast<float*>(kept_scratch(kScratchTot, size_t(mb_cap * kPanelCols * 4)));
  const uint8_t* tiles = job.tiles;
  const char* wend = reinterpret_cast<const char*>(tiles + p1 * kbn * kFp4TileBytes);
  for (int64_t m0 = 0; m0 < job.m; m0 += mb_cap) {
    const int64_t mb = job.m - m0 < mb_cap ? job.m - m0 : mb_cap;
    // X as [k_blocks][mb][128], zero past K (the tiles' padding is zero, X's may be anything).
    for (int64_t kb = 0; kb < kbn; ++kb) {
      const int64_t cols = job.k - kb * kBlockK < kBlockK ? job.k - kb * kBlockK : kBlockK;
      for (int64_t i = 0; i < mb; ++i) {
        uint16_t* d = xp + (kb * mb + i) * kBlockK;
        std::memcpy(d, job.x + (m0 + i) * job.ldx + kb * kBlockK, size_t(cols) * 2);
        if (cols < kBlockK) std::memset(d + cols, 0, size_t(kBlockK - cols) * 2);
      }
    }
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t kb0 = 0; kb0 < kbn; kb0 += chunk) {
        const int64_t kb1 = kb0 + chunk < kbn ? kb0 + chunk : kbn;
        for (int64_t i = 0; i < mb; i += kRows) {
          const int rows = mb - i < kRows ? int(mb - i) : kRows;
          for (int64_t kb = kb0; kb < kb1; ++kb) {
            const uint8_t* t = tiles + (p * kbn + kb) * kFp4TileBytes;
            // The first row block brings the weights a few tiles on into L2 (the stream over
            // this call's panels is contiguous); later row blocks find the chunk there.
            const char* pf = nullptr;
            if (i == 0) {
              const char* a = reinterpret_cast<const char*>(t + kAhead * kFp4TileBytes);
              if (a < wend) pf = a;
            }
            micro_rows(rows, xp + (kb * mb + i) * kBlockK, t, tot + i * kPanelCols, kb == 0, pf);
          }
        }
      }
      store_panel_rows(tot, mb, job.y, job.ldy, m0, p * kPanelCols, job.n, job.y_bf16);
    }
  }
}

}  // namespace moeserve::gemm_detail
