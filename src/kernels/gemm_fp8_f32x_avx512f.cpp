// gemm_fp8_f32x, AVX-512F level: F32 activations times FP8 weights converted exactly to F32 in
// registers, FP32 FMAs. For each 64-column panel and 128-wide K block, the first block of up to
// 4 rows converts the FP8 tile inside its FMA loop (W streams from memory once; the conversion
// overlaps the FMAs); with more rows the tile is converted once to F32 (32 KiB, the same
// interleaved order) and 6-row x 4-zmm register blocks run on it, with the same per-row
// arithmetic as the converting block (results do not depend on M). Rows are taken in blocks
// whose X stays in L3 while every panel passes over it (docs/kernels-gemm.md).
// Compiled with -mavx512{f,bw,vl,dq}; runs only when cpu_isa() >= Isa::kAvx512.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/gemm_fp8_internal.h"

// GCC 12's _mm512_slli_epi32 passes _mm512_undefined_epi32() (a self-initialized variable) and
// trips -Wuninitialized once inlined here (GCC bug 105593, as -Wmaybe-uninitialized elsewhere).
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace moeserve::gemm_detail {
namespace {

constexpr int kConvRows = 4;  // rows of the converting block: 16 acc + 8 W + 3 registers
constexpr int kRows = 6;      // rows of the F32-tile block: 24 acc + 4 W + 1 X registers

// Stores `cols` (<= 16) floats of v to row y (F32 or BF16, rounded to nearest even).
inline void store16(__m512 v, void* y, int64_t off, int cols, bool bf16) {
  __mmask16 m = __mmask16((1u << cols) - 1);
  if (!bf16) {
    _mm512_mask_storeu_ps(static_cast<float*>(y) + off, m, v);
    return;
  }
  __m512i u = _mm512_castps_si512(v);
  __m512i r = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                          _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  r = _mm512_srli_epi32(r, 16);
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan,
                            _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + off, m, _mm512_cvtepi32_epi16(r));
}

// Copies the last, partial K block of `rows` rows into dst [rows][128], zero-padded (the
// packed weights are zero there, and X past K must not be read).
void pad_tail(const float* x, int64_t ldx, int64_t rows, int64_t k0, int64_t k, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memset(dst + r * kBlockK, 0, kBlockK * 4);
    std::memcpy(dst + r * kBlockK, x + r * ldx + k0, size_t(k - k0) * 4);
  }
}

// 16 FP8 bytes (8 columns x 2 k, the packed order) -> 16 F32 in the same interleaved order,
// each the exact value times 2^-8. vpmovsxbw + (<< 7) puts sign | eeee mmm where FP16 has them
// (bit 15; exponent 13..10 with a zero top bit; mantissa 9..7) and a copy of the sign at bit
// 14, which the mask clears: as FP16 that is the value times 2^-8, FP8 subnormals landing on FP16
// subnormals, and vcvtph2ps is exact. No F32 subnormal ever reaches an FMA (F32 subnormal
// operands cost a microcode assist: placing the FP8 bits in an F32 and multiplying by 2^120, the
// subnormal bytes made the multiply slow).
inline __m512 fp8x16_to_f32_pairs(const uint8_t* p) {
  __m256i w = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
  __m256i h = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(short(0xbf80)));
  return _mm512_cvtph_ps(h);
}

// X[r][2kp], X[r][2kp+1] repeated over the 8 column pairs of a zmm.
inline __m512 xpair(const float* p) {
  double d;
  std::memcpy(&d, p, 8);
  return _mm512_castpd_ps(_mm512_set1_pd(d));
}

// One K block of up to kRows rows (x [R][128], row stride ld) against a tile: the FP8 tile
// converted in registers (kConverted false: the small-M, memory-bound case, W streams from memory
// once and its conversion overlaps the FMAs), or the same tile already converted to F32 in the
// same interleaved order by convert_tile (kConverted true: larger M, the conversion shared by
// every row block). Each half panel (32 columns) runs a R x 4-zmm block whose lanes hold
// (column, k parity) partial sums; the parities are added at the end of the K block. Both forms
// do the same arithmetic per row, so a row's result never depends on M (batch invariance).
// tot [R][64] as in update_tot; the 2^8 of the conversion goes into the block scale.
// Not inlined, so the caller's values do not crowd the register file.
template <int R, bool kConverted>
__attribute__((noinline)) void micro_pairs(const float* x, int64_t ld, const uint8_t* src,
                                           const float* wf, float scale, float* tot, bool first) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512 s = _mm512_set1_ps(scale * 256.0f);
  for (int half = 0; half < 2; ++half) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_setzero_ps();
    for (int kp = 0; kp < 64; ++kp) {
      __m512 w0, w1, w2, w3;
      if constexpr (kConverted) {
        const float* t = wf + kp * 128 + 64 * half;
        w0 = _mm512_load_ps(t), w1 = _mm512_load_ps(t + 16), w2 = _mm512_load_ps(t + 32),
        w3 = _mm512_load_ps(t + 48);
      } else {
        const uint8_t* t = src + kp * 128 + 64 * half;
        w0 = fp8x16_to_f32_pairs(t), w1 = fp8x16_to_f32_pairs(t + 16),
        w2 = fp8x16_to_f32_pairs(t + 32), w3 = fp8x16_to_f32_pairs(t + 48);
      }
      for (int r = 0; r < R; ++r) {
        __m512 xb = xpair(x + r * ld + 2 * kp);
        acc[r][0] = _mm512_fmadd_ps(w0, xb, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(w1, xb, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(w2, xb, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(w3, xb, acc[r][3]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int g = 0; g < 2; ++g) {  // 16 columns from two interleaved zmm
        __m512 a = acc[r][2 * g], b = acc[r][2 * g + 1];
        __m512 sum =
            _mm512_add_ps(_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b));
        float* d = tot + r * kPanelCols + 32 * half + 16 * g;
        _mm512_store_ps(d,
                        first ? _mm512_mul_ps(sum, s) : _mm512_fmadd_ps(sum, s, _mm512_load_ps(d)));
      }
    }
  }
}

template <bool kConverted>
void micro_pairs_rows(int rows, const float* x, int64_t ld, const uint8_t* src, const float* wf,
                      float scale, float* tot, bool first) {
  switch (rows) {
    case 6:
      return micro_pairs<6, kConverted>(x, ld, src, wf, scale, tot, first);
    case 5:
      return micro_pairs<5, kConverted>(x, ld, src, wf, scale, tot, first);
    case 4:
      return micro_pairs<4, kConverted>(x, ld, src, wf, scale, tot, first);
    case 3:
      return micro_pairs<3, kConverted>(x, ld, src, wf, scale, tot, first);
    case 2:
      return micro_pairs<2, kConverted>(x, ld, src, wf, scale, tot, first);
    default:
      return micro_pairs<1, kConverted>(x, ld, src, wf, scale, tot, first);
  }
}

// Tile [64 kp][64 cols][2] FP8 -> dst in the same order, F32, each value times 2^-8 (exact).
void convert_tile(const uint8_t* src, float* dst) {
  for (int i = 0; i < kTileBytes; i += 16) _mm512_store_ps(dst + i, fp8x16_to_f32_pairs(src + i));
}

// The same for a BF16 tile (PackedBf16Weight): each value exactly, as F32 (a 16-bit shift).
void convert_tile_bf16(const uint16_t* src, float* dst) {
  for (int i = 0; i < kTileBytes; i += 16) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_store_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
}

struct Scratch {
  void* p = nullptr;
  explicit Scratch(size_t bytes) : p(std::aligned_alloc(64, (bytes + 63) / 64 * 64)) {}
  ~Scratch() { std::free(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

}  // namespace

void panels_f32x_avx512(const GemmJob& job, int64_t p0, int64_t p1) {
  // Rows per block: X's block (mb rows x k F32) stays in L3 while every panel passes over it.
  int64_t mb_max = (12 << 20) / (4 * job.k);
  mb_max = mb_max < 48 ? 48 : mb_max > 1024 ? 1024 : mb_max;
  const int64_t mb_cap = job.m < mb_max ? job.m : mb_max;
  Scratch tile_buf(kBlockK * kPanelCols * 4), tot_buf(size_t(mb_cap) * kPanelCols * 4),
      tail_buf(size_t(mb_cap) * kBlockK * 4);
  float* wf = tile_buf.as<float>();
  float* tot = tot_buf.as<float>();
  const bool tail = job.k % kBlockK != 0;
  for (int64_t m0 = 0; m0 < job.m; m0 += mb_cap) {
    const int64_t mb = job.m - m0 < mb_cap ? job.m - m0 : mb_cap;
    const float* xblk = job.xf + m0 * job.ldx;
    if (tail) pad_tail(xblk, job.ldx, mb, job.k - job.k % kBlockK, job.k, tail_buf.as<float>());
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t kb = 0; kb < job.k_blocks; ++kb) {
        const float* x = xblk + kb * kBlockK;
        int64_t ld = job.ldx;
        if (tail && kb == job.k_blocks - 1) x = tail_buf.as<float>(), ld = kBlockK;
        float scale;
        if (job.bf16_tiles) {
          // BF16 weights: converted to F32 exactly whatever M is; the blocks' scale*256 is 1.
          convert_tile_bf16(reinterpret_cast<const uint16_t*>(job.tiles) +
                                (p * job.k_blocks + kb) * kTileBytes,
                            wf);
          scale = 1.0f / 256.0f;
        } else {
          const uint8_t* src = job.tiles + (p * job.k_blocks + kb) * kTileBytes;
          scale = job.scales[(p / 2) * job.k_blocks + kb];
          // Up to 4 rows: convert in registers. More: convert the tile once to F32 (its cost
          // is shared by all rows), then 6-row blocks on it.
          if (mb <= kConvRows) {
            micro_pairs_rows<false>(int(mb), x, ld, src, nullptr, scale, tot, kb == 0);
            continue;
          }
          convert_tile(src, wf);
        }
        for (int64_t i = 0; i < mb; i += kRows) {
          // The next row block's 6 x 512 bytes of X come from L3: ask for them early.
          for (int64_t r = i + kRows; r < i + 2 * kRows && r < mb; ++r)
            for (int l = 0; l < 8; ++l)
              _mm_prefetch(reinterpret_cast<const char*>(x + r * ld) + 64 * l, _MM_HINT_T0);
          int rows = mb - i < kRows ? int(mb - i) : kRows;
          micro_pairs_rows<true>(rows, x + i * ld, ld, nullptr, wf, scale, tot + i * kPanelCols,
                                 kb == 0);
        }
      }
      const int64_t col0 = p * kPanelCols;
      for (int64_t i = 0; i < mb; ++i) {
        for (int j = 0; j < 4; ++j) {
          int64_t cols = job.n - col0 - 16 * j;
          if (cols <= 0) break;
          store16(_mm512_load_ps(tot + i * kPanelCols + 16 * j), job.y,
                  (m0 + i) * job.ldy + col0 + 16 * j, cols > 16 ? 16 : int(cols), job.y_bf16);
        }
      }
    }
  }
}

}  // namespace moeserve::gemm_detail
