// gemm_int8 and gemm_int4, AVX-512 VNNI level (and the AMX level's few-row calls): the weights'
// signed bytes are flipped to unsigned (w + 128, one XOR per 64 bytes) for vpdpbusd against a
// broadcast 4-byte group of X's signed bytes; the accumulators start at -128 * (the block's sum of
// X's bytes), so they end at the exact INT32 dot product the AMX level's TDPBSSD gives. Nothing is
// converted: a decode step streams one byte per weight from memory into the dot products.
// The promotion and the activation quantization are gemm_int8.h's operations, in the same
// order as the scalar level (same bits).
// Compiled with -mavx512{f,bw,vl,dq,bf16,vnni}; runs only when cpu_isa() says so.
#include <immintrin.h>

#include <cfloat>
#include <cstdint>
#include <cstring>

#include "kernels/gemm_fp8_internal.h"

namespace moeserve::gemm_detail {
namespace {

constexpr int kRows = 6;        // register block: 6 rows x 4 zmm (64 columns) of INT32 sums
constexpr int64_t kChunk = 16;  // K blocks a row block runs in turn, at most (128 KB of tiles)
constexpr int64_t kAhead = 4;   // tiles prefetched ahead by the first row block (into L2)

// The INT32 accumulators are kept as 16 x int32 vectors, the type vpdpbusd works on: GCC 12 keeps
// an array of __m512i (8 x int64) updated through _mm512_dpbusd_epi32 on the stack, storing every
// sum and moving it back between the dot products (0.35-0.46 of the VNNI peak at 16-1024 rows).
using I32x16 = __v16si;
inline I32x16 dpbusd(I32x16 acc, __m512i u8, __m512i s8) {
  return I32x16(_mm512_dpbusd_epi32(__m512i(acc), u8, s8));
}
inline __m512 to_f32(I32x16 v) {
  // (Zero-masked with a full mask: the unmasked form trips GCC 12's -Wuninitialized.)
  return _mm512_maskz_cvtepi32_ps(__mmask16(0xffff), __m512i(v));
}

// One K block of R rows: x [R][128] (row stride 128), tile [32 quads][64 cols][4], sw [64]; tot
// [R][64] set (first) or updated. pf: a tile to bring into L2 on the way (or null).
template <int R>
__attribute__((noinline)) void micro(const int8_t* x, const float* sx, const int32_t* sums,
                                     const int8_t* tile, const float* sw, float* tot, bool first,
                                     const char* pf) {
  I32x16 acc[R][4];
  for (int r = 0; r < R; ++r) {
    const I32x16 a0 = I32x16(_mm512_set1_epi32(-128 * sums[r]));
    for (int j = 0; j < 4; ++j) acc[r][j] = a0;
  }
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  for (int q = 0; q < 32; ++q) {
    if (pf) {
      _mm_prefetch(pf + 256 * q, _MM_HINT_T1);
      _mm_prefetch(pf + 256 * q + 64, _MM_HINT_T1);
      _mm_prefetch(pf + 256 * q + 128, _MM_HINT_T1);
      _mm_prefetch(pf + 256 * q + 192, _MM_HINT_T1);
    }
    const __m512i* t = reinterpret_cast<const __m512i*>(tile + 256 * q);
    const __m512i w0 = _mm512_xor_si512(_mm512_load_si512(t), flip);
    const __m512i w1 = _mm512_xor_si512(_mm512_load_si512(t + 1), flip);
    const __m512i w2 = _mm512_xor_si512(_mm512_load_si512(t + 2), flip);
    const __m512i w3 = _mm512_xor_si512(_mm512_load_si512(t + 3), flip);
    for (int r = 0; r < R; ++r) {
      int32_t v;
      std::memcpy(&v, x + r * kBlockK + 4 * q, 4);
      const __m512i xb = _mm512_set1_epi32(v);
      acc[r][0] = dpbusd(acc[r][0], w0, xb);
      acc[r][1] = dpbusd(acc[r][1], w1, xb);
      acc[r][2] = dpbusd(acc[r][2], w2, xb);
      acc[r][3] = dpbusd(acc[r][3], w3, xb);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 vsx = _mm512_set1_ps(sx[r]);
    for (int j = 0; j < 4; ++j) {
      const __m512 s = _mm512_mul_ps(vsx, _mm512_load_ps(sw + 16 * j));
      const __m512 f = to_f32(acc[r][j]);
      float* d = tot + r * kPanelCols + 16 * j;
      _mm512_store_ps(d, first ? _mm512_mul_ps(f, s) : _mm512_fmadd_ps(f, s, _mm512_load_ps(d)));
    }
  }
}

void micro_rows(int rows, const int8_t* x, const float* sx, const int32_t* sums, const int8_t* tile,
                const float* sw, float* tot, bool first, const char* pf) {
  switch (rows) {
    case 6:
      return micro<6>(x, sx, sums, tile, sw, tot, first, pf);
    case 5:
      return micro<5>(x, sx, sums, tile, sw, tot, first, pf);
    case 4:
      return micro<4>(x, sx, sums, tile, sw, tot, first, pf);
    case 3:
      return micro<3>(x, sx, sums, tile, sw, tot, first, pf);
    case 2:
      return micro<2>(x, sx, sums, tile, sw, tot, first, pf);
    default:
      return micro<1>(x, sx, sums, tile, sw, tot, first, pf);
  }
}

// The INT4 form of micro() (gemm_int4.h): a quad's 128 bytes unpacked to the four registers
// of unsigned nibbles (two shifts and four masks: as cheap as micro()'s four flips), so the sums
// start at 0 and the block's sum of X enters through mw. sw: [2][64] (sw, then mw).
template <int R>
__attribute__((noinline)) void micro4(const int8_t* x, const float* sx, const int32_t* sums,
                                      const uint8_t* tile, const float* sw, float* tot, bool first,
                                      const char* pf) {
  I32x16 acc[R][4];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < 4; ++j) acc[r][j] = I32x16(_mm512_setzero_si512());
  }
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int q = 0; q < 32; ++q) {
    if (pf) {
      _mm_prefetch(pf + 128 * q, _MM_HINT_T1);
      _mm_prefetch(pf + 128 * q + 64, _MM_HINT_T1);
    }
    const __m512i* t = reinterpret_cast<const __m512i*>(tile + 128 * q);
    const __m512i a = _mm512_load_si512(t), b = _mm512_load_si512(t + 1);
    const __m512i w0 = _mm512_and_si512(a, low);
    const __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(a, 4), low);
    const __m512i w2 = _mm512_and_si512(b, low);
    const __m512i w3 = _mm512_and_si512(_mm512_srli_epi16(b, 4), low);
    for (int r = 0; r < R; ++r) {
      int32_t v;
      std::memcpy(&v, x + r * kBlockK + 4 * q, 4);
      const __m512i xb = _mm512_set1_epi32(v);
      acc[r][0] = dpbusd(acc[r][0], w0, xb);
      acc[r][1] = dpbusd(acc[r][1], w1, xb);
      acc[r][2] = dpbusd(acc[r][2], w2, xb);
      acc[r][3] = dpbusd(acc[r][3], w3, xb);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 vsx = _mm512_set1_ps(sx[r]);
    const __m512 vsum = _mm512_set1_ps(float(sums[r]));
    for (int j = 0; j < 4; ++j) {
      const __m512 f = to_f32(acc[r][j]);
      const __m512 mx = _mm512_mul_ps(_mm512_load_ps(sw + kPanelCols + 16 * j), vsum);
      const __m512 tb = _mm512_fmadd_ps(f, _mm512_load_ps(sw + 16 * j), mx);
      float* d = tot + r * kPanelCols + 16 * j;
      _mm512_store_ps(d,
                      first ? _mm512_mul_ps(tb, vsx) : _mm512_fmadd_ps(tb, vsx, _mm512_load_ps(d)));
    }
  }
}

void micro4_rows(int rows, const int8_t* x, const float* sx, const int32_t* sums,
                 const uint8_t* tile, const float* sw, float* tot, bool first, const char* pf) {
  switch (rows) {
    case 6:
      return micro4<6>(x, sx, sums, tile, sw, tot, first, pf);
    case 5:
      return micro4<5>(x, sx, sums, tile, sw, tot, first, pf);
    case 4:
      return micro4<4>(x, sx, sums, tile, sw, tot, first, pf);
    case 3:
      return micro4<3>(x, sx, sums, tile, sw, tot, first, pf);
    case 2:
      return micro4<2>(x, sx, sums, tile, sw, tot, first, pf);
    default:
      return micro4<1>(x, sx, sums, tile, sw, tot, first, pf);
  }
}

// 16 BF16 -> F32 (exact).
inline __m512 bf16x16(const uint16_t* p, __mmask16 m) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

}  // namespace

void quantize_rows_int8_avx512(const uint16_t* x, int64_t ldx, int64_t rows, int64_t rows_pad,
                               int64_t k, int8_t* q, float* sx, int32_t* sums) {
  const int64_t kbn = (k + kBlockK - 1) / kBlockK;
  const __m512 big = _mm512_set1_ps(FLT_MAX);
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t kb = 0; kb < kbn; ++kb) {
    const int64_t cols = k - kb * kBlockK < kBlockK ? k - kb * kBlockK : kBlockK;
    for (int64_t r = 0; r < rows_pad; ++r) {
      int8_t* d = q + (kb * rows_pad + r) * kBlockK;
      float& s = sx[kb * rows_pad + r];
      int32_t& sum = sums[kb * rows_pad + r];
      if (r >= rows) {
        std::memset(d, 0, kBlockK);
        s = 0;
        sum = 0;
        continue;
      }
      const uint16_t* src = x + r * ldx + kb * kBlockK;
      __m512 f[8];
      __m512 amax = _mm512_setzero_ps();
      __mmask16 bad = 0;
      for (int v = 0; v < 8; ++v) {
        const int64_t n = cols - 16 * v;
        const __mmask16 m = n >= 16 ? __mmask16(0xffff) : n <= 0 ? 0 : __mmask16((1u << n) - 1);
        f[v] = bf16x16(src + 16 * v, m);
        const __m512 a = _mm512_and_ps(f[v], abs_mask);
        bad |= _mm512_cmp_ps_mask(a, big, _CMP_NLE_UQ);  // Inf or NaN
        amax = _mm512_max_ps(amax, a);
      }
      const float am = _mm512_reduce_max_ps(amax);
      if (bad || am == 0) {
        std::memset(d, 0, kBlockK);
        s = bad ? __builtin_nanf("") : 0.0f;
        sum = 0;
        continue;
      }
      const __m512 inv = _mm512_set1_ps(127.0f / am);
      __m512i acc = _mm512_setzero_si512();
      for (int v = 0; v < 8; ++v) {
        const __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(f[v], inv));  // nearest even
        acc = _mm512_add_epi32(acc, qi);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 16 * v), _mm512_cvtsepi32_epi8(qi));
      }
      s = am / 127.0f;
      sum = _mm512_reduce_add_epi32(acc);
    }
  }
}

namespace {

// INT8 tiles (micro) or INT4 tiles (micro4): the same loops over half or whole tiles.
template <bool kInt4>
void panels_vnni(const GemmJob& job, int64_t p0, int64_t p1) {
  constexpr int64_t tile_bytes = kInt4 ? kTileBytes / 2 : kTileBytes;
  constexpr int64_t scale_stride = kInt4 ? 2 * kPanelCols : kPanelCols;
  // Rows per block: the quantized X of the block (mb x K bytes) stays in L3 while every panel
  // passes over it.
  int64_t mb_max = (12 << 20) / job.k;
  mb_max = mb_max < 96 ? 96 : mb_max > 1024 ? 1024 : mb_max;
  const int64_t m_blocks = (job.m + mb_max - 1) / mb_max;
  int64_t mb_cap = (job.m + m_blocks - 1) / m_blocks;
  if (m_blocks > 1) mb_cap = (mb_cap + kRows - 1) / kRows * kRows;
  const int64_t kbn = job.k_blocks;
  // K blocks a row block runs in turn: their tiles (up to kChunk x 8 KB) and the whole block's X
  // over them (mb x 128 bytes a K block) stay in L2 while every row block passes.
  int64_t chunk = (512 << 10) / (mb_cap * kBlockK);
  chunk = chunk < 2 ? 2 : chunk > kChunk ? kChunk : chunk;
  if (chunk > kbn) chunk = kbn;
  auto* xq = static_cast<int8_t*>(kept_scratch(kScratchX, size_t(mb_cap * kbn * kBlockK)));
  auto* xs = static_cast<float*>(kept_scratch(kScratchXScale, size_t(mb_cap * kbn * 8)));
  auto* sums = reinterpret_cast<int32_t*>(xs + mb_cap * kbn);
  auto* tot = static_cast<float*>(kept_scratch(kScratchTot, size_t(mb_cap * kPanelCols * 4)));
  const uint8_t* tiles = job.tiles;
  const char* wend = reinterpret_cast<const char*>(tiles + p1 * kbn * tile_bytes);
  for (int64_t m0 = 0; m0 < job.m; m0 += mb_cap) {
    const int64_t mb = job.m - m0 < mb_cap ? job.m - m0 : mb_cap;
    quantize_rows_int8_avx512(job.x + m0 * job.ldx, job.ldx, mb, mb, job.k, xq, xs, sums);
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t kb0 = 0; kb0 < kbn; kb0 += chunk) {
        const int64_t kb1 = kb0 + chunk < kbn ? kb0 + chunk : kbn;
        for (int64_t i = 0; i < mb; i += kRows) {
          const int rows = mb - i < kRows ? int(mb - i) : kRows;
          for (int64_t kb = kb0; kb < kb1; ++kb) {
            const uint8_t* t = tiles + (p * kbn + kb) * tile_bytes;
            // The first row block brings the weights a few tiles on into L2 (the stream over
            // this call's panels is contiguous); later row blocks find the chunk there.
            const char* pf = nullptr;
            if (i == 0) {
              const char* a = reinterpret_cast<const char*>(t + kAhead * tile_bytes);
              if (a < wend) pf = a;
            }
            const float* sw = job.scales + (p * kbn + kb) * scale_stride;
            if constexpr (kInt4) {
              micro4_rows(rows, xq + (kb * mb + i) * kBlockK, xs + kb * mb + i, sums + kb * mb + i,
                          t, sw, tot + i * kPanelCols, kb == 0, pf);
            } else {
              micro_rows(rows, xq + (kb * mb + i) * kBlockK, xs + kb * mb + i, sums + kb * mb + i,
                         reinterpret_cast<const int8_t*>(t), sw, tot + i * kPanelCols, kb == 0, pf);
            }
          }
        }
      }
      store_panel_rows(tot, mb, job.y, job.ldy, m0, p * kPanelCols, job.n, job.y_bf16);
    }
  }
}

}  // namespace

void panels_int8_vnni(const GemmJob& job, int64_t p0, int64_t p1) {
  panels_vnni<false>(job, p0, p1);
}

void panels_int4_vnni(const GemmJob& job, int64_t p0, int64_t p1) {
  panels_vnni<true>(job, p0, p1);
}

}  // namespace moeserve::gemm_detail
