// gemm_fp8, AVX-512 + BF16 level: FP8 weights become BF16 in registers (exact, by byte
// lookups), then vdpbf16ps against BF16 pairs of X (docs/kernels-gemm.md has the arithmetic).
// For each 64-column panel and 128-wide K block, the first block of up to 6 rows converts the
// FP8 tile inside its dot-product loop (so W streams from memory once, and the conversion
// overlaps the dot products); with more rows it also keeps the BF16 tile for the next 6-row
// blocks, which run a 6-row x 4-zmm register block on it. A row block runs a chunk of K blocks
// in turn (its running sums stay in L1, the chunk's tiles in L2). Rows are taken in blocks
// whose X stays in L3 while every panel passes over it.
// Compiled with -mavx512{f,bw,vl,dq,bf16}; runs only when cpu_isa() says so.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/gemm_fp8_internal.h"

namespace moeserve::gemm_detail {
namespace {

constexpr int kRows = 6;  // register block of the tiled path: 6 rows x 4 zmm (64 columns)

struct Consts {
  __m512i perm;      // byte order for the unpacks (see fp8x64_to_bf16)
  __m512i lo0, lo1;  // low byte of bf16(e4m3(v)), v = 0..127
  __m512i hi0, hi1;  // high byte of bf16(e4m3(v)) without the sign
};

// BF16 bits of the e4m3 value with the bits v (0..127, sign clear), exactly: a normal
// 0.eeee.mmm is 2^(e-7) * 1.mmm = BF16 exponent e + 120; a subnormal m * 2^-9 is a normal BF16
// number; 0x7f is NaN.
uint16_t e4m3_bf16_bits(int v) {
  if (v == 0x7f) return 0x7fc0;
  const int e = v >> 3, m = v & 7;
  if (e != 0) return uint16_t(((e + 120) << 7) | (m << 4));
  float f = float(m) / 512.0f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}

// The tables, built once (make_consts runs per GEMM job and thread).
struct Tables {
  alignas(64) uint8_t lo[128], hi[128], perm[64];
  Tables() {
    for (int v = 0; v < 128; ++v) {
      lo[v] = uint8_t(e4m3_bf16_bits(v) & 0xff);
      hi[v] = uint8_t(e4m3_bf16_bits(v) >> 8);
    }
    // unpacklo/hi_epi8 take bytes 0-7 / 8-15 of each 128-bit lane L into words 8L..8L+7; the
    // first output zmm must hold source bytes 0-31 in order, the second bytes 32-63.
    for (int L = 0; L < 4; ++L) {
      for (int w = 0; w < 8; ++w) {
        perm[16 * L + w] = uint8_t(8 * L + w);
        perm[16 * L + 8 + w] = uint8_t(32 + 8 * L + w);
      }
    }
  }
};

Consts make_consts() {
  static const Tables t;
  return Consts{_mm512_load_si512(t.perm), _mm512_load_si512(t.lo), _mm512_load_si512(t.lo + 64),
                _mm512_load_si512(t.hi), _mm512_load_si512(t.hi + 64)};
}

// 64 FP8 bytes -> 64 BF16 in two zmm (each 16 columns x 2 k in the packed order: out0 from bytes
// 0-31, out1 from bytes 32-63). Two 128-entry byte lookups give each value's low and high BF16
// byte (the sign is OR-ed into the high byte), interleaved by the unpacks: 6 instructions for
// 64 values, where the arithmetic form (shift, mask, add, and a subnormal fix-up) took 14.
inline void fp8x64_to_bf16(const uint8_t* p, const Consts& c, __m512i& out0, __m512i& out1) {
  // (Zero-masked with a full mask: GCC 12's unmasked form trips -Wuninitialized, bug 105593.)
  const __m512i b = _mm512_maskz_permutexvar_epi8(~__mmask64(0), c.perm, _mm512_loadu_si512(p));
  const __m512i lo = _mm512_permutex2var_epi8(c.lo0, b, c.lo1);
  __m512i hi = _mm512_permutex2var_epi8(c.hi0, b, c.hi1);
  hi = _mm512_ternarylogic_epi32(hi, b, _mm512_set1_epi8(char(0x80)), 0xf8);  // hi | (b & 0x80)
  out0 = _mm512_unpacklo_epi8(lo, hi);
  out1 = _mm512_unpackhi_epi8(lo, hi);
}

inline __m512bh as_bh(__m512i v) {
  return reinterpret_cast<__m512bh&>(v);
}

// X[r][2kp], X[r][2kp+1] broadcast to all 16 lanes (folds into vdpbf16ps's {1to16} operand).
inline __m512bh xpair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return as_bh(_mm512_set1_epi32(v));
}

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

// Copies the last, partial K block of `rows` rows into dst [rows][128], zero-padded.
void pad_tail(const uint16_t* x, int64_t ldx, int64_t rows, int64_t k0, int64_t k, uint16_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memset(dst + r * kBlockK, 0, kBlockK * 2);
    std::memcpy(dst + r * kBlockK, x + r * ldx + k0, size_t(k - k0) * 2);
  }
}

// One K block of up to kRows rows against an FP8 tile converted on the fly; with kStore the
// converted BF16 tile also goes to dst for the following row blocks. Converting inside the
// dot-product loop lets the out-of-order core overlap the integer conversion with vdpbf16ps.
// tot [R][64] as in micro_tile.
template <int R, bool kStore>
__attribute__((noinline)) void micro_convert(const uint16_t* x, int64_t ld, const uint8_t* src,
                                             __m512i* dst, float scale, float* tot, bool first,
                                             const Consts& c) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int kp = 0; kp < 64; ++kp) {
    __m512i wi[4];
    fp8x64_to_bf16(src + kp * 128, c, wi[0], wi[1]);
    fp8x64_to_bf16(src + kp * 128 + 64, c, wi[2], wi[3]);
    if constexpr (kStore) {
      for (int j = 0; j < 4; ++j) _mm512_store_si512(dst + kp * 4 + j, wi[j]);
    }
    for (int r = 0; r < R; ++r) {
      __m512bh xb = xpair(x + r * ld + 2 * kp);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], as_bh(wi[j]), xb);
    }
  }
  __m512 s = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < 4; ++j) {
      float* d = tot + r * kPanelCols + 16 * j;
      __m512 v =
          first ? _mm512_mul_ps(acc[r][j], s) : _mm512_fmadd_ps(acc[r][j], s, _mm512_load_ps(d));
      _mm512_store_ps(d, v);
    }
  }
}

template <bool kStore>
void micro_convert_rows(int rows, const uint16_t* x, int64_t ld, const uint8_t* src, __m512i* dst,
                        float scale, float* tot, bool first, const Consts& c) {
  switch (rows) {
    case 6:
      return micro_convert<6, kStore>(x, ld, src, dst, scale, tot, first, c);
    case 5:
      return micro_convert<5, kStore>(x, ld, src, dst, scale, tot, first, c);
    case 4:
      return micro_convert<4, kStore>(x, ld, src, dst, scale, tot, first, c);
    case 3:
      return micro_convert<3, kStore>(x, ld, src, dst, scale, tot, first, c);
    case 2:
      return micro_convert<2, kStore>(x, ld, src, dst, scale, tot, first, c);
    default:
      return micro_convert<1, kStore>(x, ld, src, dst, scale, tot, first, c);
  }
}

// One K block of a kRows-or-fewer row block against a converted BF16 tile [64 kp][64 cols][2].
// tot [R][64]: the running two-level sum, set (first) or updated with scale * block sum.
// pf_n (<= 128) lines from pf are prefetched to L2 on the way, one or two per k-pair.
// Not inlined: 24 accumulators + 4 W + 1 X register need the caller's constants out of the
// register file, or the compiler reloads W for every row.
template <int R>
__attribute__((noinline)) void micro_tile(const uint16_t* x, int64_t ld, const __m512i* tile,
                                          float scale, float* tot, bool first, const char* pf,
                                          int pf_n) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int kp = 0; kp < 64; ++kp) {
    if (kp < pf_n) _mm_prefetch(pf + 64 * kp, _MM_HINT_T1);
    if (kp + 64 < pf_n) _mm_prefetch(pf + 64 * (kp + 64), _MM_HINT_T1);
    const __m512i* t = tile + kp * 4;
    __m512bh w0 = as_bh(t[0]), w1 = as_bh(t[1]), w2 = as_bh(t[2]), w3 = as_bh(t[3]);
    for (int r = 0; r < R; ++r) {
      __m512bh xb = xpair(x + r * ld + 2 * kp);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w0, xb);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w1, xb);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], w2, xb);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], w3, xb);
    }
  }
  __m512 s = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < 4; ++j) {
      float* d = tot + r * kPanelCols + 16 * j;
      __m512 v =
          first ? _mm512_mul_ps(acc[r][j], s) : _mm512_fmadd_ps(acc[r][j], s, _mm512_load_ps(d));
      _mm512_store_ps(d, v);
    }
  }
}

void micro_tile_rows(int rows, const uint16_t* x, int64_t ld, const __m512i* tile, float scale,
                     float* tot, bool first, const char* pf = nullptr, int pf_n = 0) {
  switch (rows) {
    case 6:
      return micro_tile<6>(x, ld, tile, scale, tot, first, pf, pf_n);
    case 5:
      return micro_tile<5>(x, ld, tile, scale, tot, first, pf, pf_n);
    case 4:
      return micro_tile<4>(x, ld, tile, scale, tot, first, pf, pf_n);
    case 3:
      return micro_tile<3>(x, ld, tile, scale, tot, first, pf, pf_n);
    case 2:
      return micro_tile<2>(x, ld, tile, scale, tot, first, pf, pf_n);
    default:
      return micro_tile<1>(x, ld, tile, scale, tot, first, pf, pf_n);
  }
}

// The same K block summed as AMX's TDPBF16PS sums it, so that rows run here and rows run on the
// tile unit give the same bits (docs/kernels-amx.md, "Numerics"): per 32-wide K step (16
// k-pairs), the even elements' products are summed in order from zero, the odd elements' apart,
// each rounded to F32 after every product (an FMA: the product of two BF16 numbers is exact),
// and the step adds (even + odd) to the block's sum; denormal sums are flushed to zero. Here
// vdpbf16ps does each chain: against a pair (x_even, 0) it is one FMA of the even product, and
// against (0, x_odd) one of the odd. xs holds those pairs, [row][k-pair][2] as 32-bit words.
inline __m512 flush_denormal(__m512 v) {
  const __mmask16 d = _mm512_fpclass_ps_mask(v, 0x20);  // denormal
  return _mm512_mask_and_ps(v, d, v, _mm512_set1_ps(-0.0f));
}

inline __m512bh xword(const uint32_t* p) {
  return as_bh(_mm512_set1_epi32(int32_t(*p)));
}

// One row's K block: with kConvert the weights are the FP8 tile src, converted on the fly, else
// the BF16 tile `tile`. xs: the row's split pairs for the block. tot [64] as in micro_tile.
template <bool kConvert>
__attribute__((noinline)) void micro_amx_sums(const uint32_t* xs, const uint8_t* src,
                                              const __m512i* tile, float scale, float* tot,
                                              bool first, const char* pf) {
  const Consts c = kConvert ? make_consts() : Consts{};
  __m512 sum[4];
  for (int j = 0; j < 4; ++j) sum[j] = _mm512_setzero_ps();
  for (int q = 0; q < 4; ++q) {
    __m512 ev[4], od[4];
    for (int j = 0; j < 4; ++j) ev[j] = od[j] = _mm512_setzero_ps();
    for (int kp = 16 * q; kp < 16 * q + 16; ++kp) {
      if (pf) {  // the tile's bytes a few tiles on, a line per 64 bytes read here
        constexpr int kLines = kConvert ? 2 : 4;
        for (int l = 0; l < kLines; ++l) _mm_prefetch(pf + 64 * (kLines * kp + l), _MM_HINT_T1);
      }
      __m512i w[4];
      if constexpr (kConvert) {
        fp8x64_to_bf16(src + kp * 128, c, w[0], w[1]);
        fp8x64_to_bf16(src + kp * 128 + 64, c, w[2], w[3]);
      } else {
        for (int j = 0; j < 4; ++j) w[j] = tile[kp * 4 + j];
      }
      const __m512bh xe = xword(xs + 2 * kp), xo = xword(xs + 2 * kp + 1);
      for (int j = 0; j < 4; ++j) {
        ev[j] = _mm512_dpbf16_ps(ev[j], as_bh(w[j]), xe);
        od[j] = _mm512_dpbf16_ps(od[j], as_bh(w[j]), xo);
      }
    }
    for (int j = 0; j < 4; ++j)
      sum[j] = flush_denormal(_mm512_add_ps(sum[j], flush_denormal(_mm512_add_ps(ev[j], od[j]))));
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int j = 0; j < 4; ++j) {
    float* d = tot + 16 * j;
    _mm512_store_ps(
        d, first ? _mm512_mul_ps(sum[j], s) : _mm512_fmadd_ps(sum[j], s, _mm512_load_ps(d)));
  }
}

// Rows [0, rows) of x (BF16, row stride ldx, k columns) as split pairs xs [rows][k_blocks * 64][2]
// (x_even | 0, 0 | x_odd << 16 as BF16 bits), zero past k.
void split_pairs(const uint16_t* x, int64_t ldx, int64_t rows, int64_t k, int64_t k_blocks,
                 uint32_t* xs) {
  const int64_t words = k_blocks * kBlockK;  // 2 per k-pair
  const __m512i lo = _mm512_set1_epi32(0xffff);
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* xr = x + r * ldx;
    uint32_t* d = xs + r * words;
    int64_t c = 0;
    for (; c + 32 <= k; c += 32) {  // 16 pairs -> 32 words
      const __m512i v = _mm512_loadu_si512(xr + c);
      const __m512i e = _mm512_and_si512(v, lo), o = _mm512_andnot_si512(lo, v);
      // Unpacks work per 128-bit lane: a holds pairs 0-1, 4-5, 8-9, 12-13, b pairs 2-3, 6-7, ...
      const __m512i a = _mm512_unpacklo_epi32(e, o), b = _mm512_unpackhi_epi32(e, o);
      const __m512i i0 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
      const __m512i i1 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
      _mm512_storeu_si512(d + c, _mm512_permutex2var_epi64(a, i0, b));
      _mm512_storeu_si512(d + c + 16, _mm512_permutex2var_epi64(a, i1, b));
    }
    for (; c < words; ++c) {
      const uint32_t v = c < k ? xr[c] : 0;
      d[c] = c % 2 == 0 ? v : v << 16;
    }
  }
}

// Per-thread scratch kept between calls: a GEMM job is often one expert's few rows, and the
// chunk's tiles (256 KB) allocated per call came from mmap, page faults and all, every time.
class KeptScratch {
 public:
  ~KeptScratch() { std::free(p_); }
  void* get(size_t bytes) {
    if (bytes > cap_) {
      std::free(p_);
      cap_ = (bytes + 63) / 64 * 64;
      p_ = std::aligned_alloc(64, cap_);
    }
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

thread_local KeptScratch tls_scratch[kScratchSlots];

template <class T>
T* scratch(int slot, size_t bytes) {
  return static_cast<T*>(kept_scratch(slot, bytes));
}

// K blocks per chunk: a row block runs all of a chunk's tiles in turn, so its running sums
// (6 x 64 F32) stay in L1 while the chunk's BF16 tiles (16 KB each) come from L2.
constexpr int64_t kChunk = 16;

void panels_tiled(const GemmJob& job, int64_t p0, int64_t p1, const Consts& c) {
  // Rows per block: X's block (mb rows x k) stays in L3 while every panel passes over it.
  int64_t mb_max = (12 << 20) / (2 * job.k);
  mb_max = mb_max < 96 ? 96 : mb_max > 1024 ? 1024 : mb_max;
  // Blocks of equal size, whole register blocks where possible: every block converts each tile
  // once, so a short last block (1024 rows at K = 7168 were 877 + 147) pays that for few rows.
  const int64_t m_blocks = (job.m + mb_max - 1) / mb_max;
  int64_t mb_cap = (job.m + m_blocks - 1) / m_blocks;
  if (m_blocks > 1) mb_cap = (mb_cap + kRows - 1) / kRows * kRows;
  const int64_t chunk = job.k_blocks < kChunk ? job.k_blocks : kChunk;
  // BF16 tiles are kept only when more than one row block reads them.
  __m512i* tiles = job.m > kRows && !job.bf16_tiles
                       ? scratch<__m512i>(kScratchTiles, size_t(kTileBytes * 2 * chunk))
                       : nullptr;
  float* tot = scratch<float>(kScratchTot, size_t(mb_cap * kPanelCols * 4));
  const bool tail = job.k % kBlockK != 0;
  uint16_t* tail_x = tail ? scratch<uint16_t>(kScratchTail, size_t(mb_cap * kBlockK * 2)) : nullptr;
  const int64_t last = job.k_blocks - 1;
  const int64_t tile_bytes = job.bf16_tiles ? 2 * kTileBytes : kTileBytes;
  for (int64_t m0 = 0; m0 < job.m; m0 += mb_cap) {
    const int64_t mb = job.m - m0 < mb_cap ? job.m - m0 : mb_cap;
    const uint16_t* xblk = job.x + m0 * job.ldx;
    if (tail) pad_tail(xblk, job.ldx, mb, job.k - job.k % kBlockK, job.k, tail_x);
    // X rows [r, r + rows) of K block kb, and their row stride.
    auto x_at = [&](int64_t r, int64_t kb, int64_t& ld) -> const uint16_t* {
      if (tail && kb == last) {
        ld = kBlockK;
        return tail_x + r * kBlockK;
      }
      ld = job.ldx;
      return xblk + r * job.ldx + kb * kBlockK;
    };
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t kb0 = 0; kb0 < job.k_blocks; kb0 += chunk) {
        const int64_t kb1 = kb0 + chunk < job.k_blocks ? kb0 + chunk : job.k_blocks;
        // The row blocks after the first run on tiles already in L2 and leave DRAM idle: they
        // bring the next chunk's weights (contiguous after this chunk's) into L2, spread evenly
        // over their calls, so the first row block of the next chunk finds them there.
        const char* pf = nullptr;
        const char* pf_end = nullptr;
        int64_t pf_lines = 0;
        if (mb > kRows) {
          const int64_t next = p * job.k_blocks + kb1, end = p1 * job.k_blocks;
          if (next < end) {
            const int64_t n_tiles = end - next < chunk ? end - next : chunk;
            pf = reinterpret_cast<const char*>(job.tiles) + next * tile_bytes;
            pf_end = pf + n_tiles * tile_bytes;
            const int64_t calls = (mb - 1) / kRows * (kb1 - kb0);
            pf_lines = (n_tiles * tile_bytes / 64 + calls - 1) / calls;
          }
        }
        for (int64_t i = 0; i < mb; i += kRows) {
          const int rows = mb - i < kRows ? int(mb - i) : kRows;
          for (int64_t kb = kb0; kb < kb1; ++kb) {
            int64_t ld;
            const uint16_t* x = x_at(i, kb, ld);
            // The next call's X (this row block's next K block, or the next row block's first)
            // comes from L2 or L3: ask for it early.
            {
              const int64_t ni = kb + 1 < kb1 ? i : i + kRows, nkb = kb + 1 < kb1 ? kb + 1 : kb0;
              if (ni < mb) {
                int64_t nld;
                const uint16_t* nx = x_at(ni, nkb, nld);
                const int64_t nrows = mb - ni < kRows ? mb - ni : kRows;
                for (int64_t r = 0; r < nrows; ++r)
                  for (int l = 0; l < 4; ++l)
                    _mm_prefetch(reinterpret_cast<const char*>(nx + r * nld) + 64 * l, _MM_HINT_T0);
              }
            }
            int pf_n = 0;
            const char* pf_at = pf;
            if (i > 0 && pf < pf_end) {
              int64_t n = (pf_end - pf) / 64;
              n = n < pf_lines ? n : pf_lines;
              // Up to two lines per k-pair go inside the call's loop (a burst of prefetches
              // stalls once the miss buffers fill); any beyond 128 lines here.
              for (int64_t l = 128; l < n; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T1);
              pf_n = int(n < 128 ? n : 128);
              pf += 64 * n;
            }
            float* t_rows = tot + i * kPanelCols;
            if (job.bf16_tiles) {
              // Already BF16: every row block runs the register block on the tile (the first
              // one brings it from memory), scale 1 (exact).
              const __m512i* t = reinterpret_cast<const __m512i*>(job.tiles) +
                                 (p * job.k_blocks + kb) * kTileBytes / 32;
              micro_tile_rows(rows, x, ld, t, 1.0f, t_rows, kb == 0, pf_at, pf_n);
              continue;
            }
            const float scale = job.scales[(p / 2) * job.k_blocks + kb];
            __m512i* t = tiles ? tiles + (kb - kb0) * kTileBytes / 32 : nullptr;
            if (i == 0) {
              // The first row block converts the tile (and keeps it if other rows follow).
              const uint8_t* src = job.tiles + (p * job.k_blocks + kb) * kTileBytes;
              if (mb <= kRows)
                micro_convert_rows<false>(rows, x, ld, src, t, scale, t_rows, kb == 0, c);
              else
                micro_convert_rows<true>(rows, x, ld, src, t, scale, t_rows, kb == 0, c);
            } else {
              micro_tile_rows(rows, x, ld, t, scale, t_rows, kb == 0, pf_at, pf_n);
            }
          }
        }
      }
      store_panel_rows(tot, mb, job.y, job.ldy, m0, p * kPanelCols, job.n, job.y_bf16);
    }
  }
}

// One row (batch-1 decode) summed as the tile unit sums it: see micro_amx_sums. Each FP8 tile is
// converted in registers, as at this level, for each row: the AMX level sends only one-row jobs
// here (at two rows the tile unit is already faster on these cores; docs/kernels-amx.md).
void panels_amx_sums(const GemmJob& job, int64_t p0, int64_t p1) {
  const int64_t m = job.m, words = job.k_blocks * kBlockK;
  uint32_t* xs = scratch<uint32_t>(kScratchXSplit, size_t(m * words * 4));
  split_pairs(job.x, job.ldx, m, job.k, job.k_blocks, xs);
  float* tot = scratch<float>(kScratchTot, size_t(m * kPanelCols * 4));
  const int64_t tile_bytes = job.bf16_tiles ? 2 * kTileBytes : kTileBytes;
  const uint8_t* end = job.tiles + p1 * job.k_blocks * tile_bytes;
  constexpr int64_t kAheadTiles = 8;
  for (int64_t p = p0; p < p1; ++p) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t kb = 0; kb < job.k_blocks; ++kb) {
        const uint32_t* x = xs + i * words + kb * kBlockK;
        const uint8_t* w = job.tiles + (p * job.k_blocks + kb) * tile_bytes;
        float* t_row = tot + i * kPanelCols;
        // One stream of weights read once, prefetched into L2 well ahead: with twice this
        // level's dot products per byte, the core alone kept too few misses in flight and read
        // 0.87-0.95 of what this level's own one-row kernel reads (docs/kernels-amx.md).
        const uint8_t* ahead = w + kAheadTiles * tile_bytes;
        const char* pf = i == 0 && ahead < end ? reinterpret_cast<const char*>(ahead) : nullptr;
        if (job.bf16_tiles) {
          micro_amx_sums<false>(x, nullptr, reinterpret_cast<const __m512i*>(w), 1.0f, t_row,
                                kb == 0, pf);
        } else {
          micro_amx_sums<true>(x, w, nullptr, job.scales[(p / 2) * job.k_blocks + kb], t_row,
                               kb == 0, pf);
        }
      }
    }
    store_panel_rows(tot, m, job.y, job.ldy, 0, p * kPanelCols, job.n, job.y_bf16);
  }
}

}  // namespace

void* kept_scratch(int slot, size_t bytes) {
  return tls_scratch[slot].get(bytes);
}

void convert_tile_bf16(const uint8_t* src, uint16_t* dst, const uint8_t* prefetch) {
  const Consts c = make_consts();
  __m512i* d = reinterpret_cast<__m512i*>(dst);
  for (int64_t i = 0; i < kTileBytes / 64; ++i) {
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(prefetch) + 64 * i, _MM_HINT_T1);
    __m512i lo, hi;
    fp8x64_to_bf16(src + 64 * i, c, lo, hi);
    _mm512_store_si512(d + 2 * i, lo);
    _mm512_store_si512(d + 2 * i + 1, hi);
  }
}

void store_panel_rows(const float* tot, int64_t rows, void* y, int64_t ldy, int64_t row0,
                      int64_t col0, int64_t n, bool y_bf16) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int j = 0; j < 4; ++j) {
      int64_t cols = n - col0 - 16 * j;
      if (cols <= 0) break;
      store16(_mm512_load_ps(tot + i * kPanelCols + 16 * j), y, (row0 + i) * ldy + col0 + 16 * j,
              cols > 16 ? 16 : int(cols), y_bf16);
    }
  }
}

void panels_avx512bf16_amx_sums(const GemmJob& job, int64_t p0, int64_t p1) {
  panels_amx_sums(job, p0, p1);
}

void panels_avx512bf16(const GemmJob& job, int64_t p0, int64_t p1) {
  const Consts c = make_consts();
  panels_tiled(job, p0, p1, c);
}

}  // namespace moeserve::gemm_detail
