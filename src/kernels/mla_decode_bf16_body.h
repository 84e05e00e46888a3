// The BF16 MLA kernel's body (docs/kernels-mla.md), included into the anonymous namespace of
// mla_decode_avx512.cpp (the AVX-512 BF16 level) and of mla_decode_amx.cpp (the AMX level, which
// adds the tile-unit forms of steps 1 and 4 under __AMX_TILE__). Each file compiles its own copy
// with its own flags (see cpu_features.h on why ISA files share no inline code).
// Needs <immintrin.h>, <math.h>, <string.h>, <cstdint> and mla_decode_internal.h first.
// NOLINT(build/header_guard): included once per TU, inside a namespace.

constexpr int64_t kTile = 64;  // tokens per tile = one cache block

inline int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}
inline int64_t round_up(int64_t a, int64_t m) {
  return (a + m - 1) / m * m;
}
inline __m512bh as_bh(__m512i v) {
  return reinterpret_cast<__m512bh&>(v);
}
inline __m512bh as_bh(__m512 v) {
  return reinterpret_cast<__m512bh&>(v);
}

// The F32 levels' vector type, for its exp2 (one copy of the polynomial for every AVX-512
// level) and its FP8 conversion (fp8_pairs); this TU's anonymous namespace keeps it local.
#include "kernels/vec_avx512f.h"

inline __m512 exp2_ps(__m512 x) {
  return Vec::exp2(x);
}

// Pointers into the calling thread's scratch (thread_scratch_parts), carved per piece.
struct Work {
  int64_t M, Mz, R, D, Dp;
  int64_t dp0;      // the first pair of Q that is not zero in every row (Ctx::q_zero_pairs)
  int64_t ldv;      // row stride of vp: R + 16, so its 32 rows do not crowd a few L1 sets
  uint32_t* qp;     // [Dp][M] BF16 pairs of Q (its BF16 rounding: the hi part)
  uint32_t* qlo;    // [Dp][M] BF16 pairs of Q - hi (q_split only)
  float* s;         // [kTile][M] scores, then base-2 logits
  uint32_t* pp;     // [kTile / 2][M] BF16 pairs of P (tokens 2i, 2i+1)
  uint32_t* pplo;   // [kTile / 2][M] BF16 pairs of P - hi (p_split only)
  uint32_t* ppt;    // [M][kTile / 2] pp transposed: AMX's A operand of P V (AMX only)
  uint32_t* pptlo;  // [M][kTile / 2] pplo transposed (AMX, p_split only)
  uint32_t* vp;     // [kTile / 2][ldv] BF16 token pairs of V, 32-value chunks as unpack lays them
  float* o;         // [M][R] unnormalised output, chunk order as vp
  float* m;         // [M] running max (base-2 logits)
  float* l;         // [M] running sum of P
  float* alpha;     // [M] rescale of O for the current tile
  int32_t* lim;     // [M] tokens visible to each row (0 for padding rows)
  uint16_t* qrow;   // [2][16][D] 16 query rows converted to BF16: hi rows, then lo rows
  uint16_t* kdq;    // [kTile][D] an FP8 cache block dequantized to BF16 (FP8 cache only)
  const char* pf;   // next cache line of the next block to prefetch, up to pf_end
  const char* pf_end;
};

Work carve(int64_t M, int64_t R, int64_t D, bool fp8, bool amx) {
  Work w{};
  w.M = M;
  w.Mz = M / 16;
  w.R = R;
  w.D = D;
  w.Dp = D / 2;
  w.ldv = R + 16;
  const size_t sz[15] = {size_t(w.Dp * M) * 4,
                         size_t(w.Dp * M) * 4,
                         size_t(kTile * M) * 4,
                         size_t(kTile / 2 * M) * 4,
                         size_t(kTile / 2 * M) * 4,
                         size_t(kTile / 2 * w.ldv) * 4,
                         size_t(M * R) * 4,
                         size_t(M) * 4,
                         size_t(M) * 4,
                         size_t(M) * 4,
                         size_t(M) * 4,
                         size_t(32 * D) * 2 + 64,
                         fp8 ? size_t(kTile * D) * 2 : 0,
                         amx ? size_t(M * kTile / 2) * 4 : 0,
                         amx ? size_t(M * kTile / 2) * 4 : 0};
  char* part[15];
  thread_scratch_parts(sz, 15, part);
  w.qp = reinterpret_cast<uint32_t*>(part[0]);
  w.qlo = reinterpret_cast<uint32_t*>(part[1]);
  w.s = reinterpret_cast<float*>(part[2]);
  w.pp = reinterpret_cast<uint32_t*>(part[3]);
  w.pplo = reinterpret_cast<uint32_t*>(part[4]);
  w.vp = reinterpret_cast<uint32_t*>(part[5]);
  w.o = reinterpret_cast<float*>(part[6]);
  w.m = reinterpret_cast<float*>(part[7]);
  w.l = reinterpret_cast<float*>(part[8]);
  w.alpha = reinterpret_cast<float*>(part[9]);
  w.lim = reinterpret_cast<int32_t*>(part[10]);
  w.qrow = reinterpret_cast<uint16_t*>(part[11]);
  w.kdq = reinterpret_cast<uint16_t*>(part[12]);
  w.ppt = reinterpret_cast<uint32_t*>(part[13]);
  w.pptlo = reinterpret_cast<uint32_t*>(part[14]);
  return w;
}

// Tokens [0, nt) of an FP8 block (kv_token.h) -> BF16 rows [nt][D] at dst, and rows [nt, nt16)
// zero (the scores read them; the mask drops them). e4m3 x its tile's power-of-two scale is
// exact in BF16, so the kernel then reads the very values the reference reads (fp8_pairs gives
// e4m3 x 2^-8 without F32 subnormals; times scale x 2^8 it is the product, rounded once).
void dequantize_fp8_block(const Ctx& c, const uint8_t* blk, int64_t nt, int64_t nt16,
                          uint16_t* dst) {
  const int64_t D = c.dim, R = c.kv_lora_rank;
  for (int64_t t = 0; t < nt; ++t) {
    const uint8_t* tok = blk + t * c.token_bytes;
    uint16_t* row = dst + t * D;
    for (int64_t t0 = 0; t0 < R; t0 += kFp8Tile) {
      float scale;
      memcpy(&scale, tok + R + t0 / kFp8Tile * 4, 4);
      const __m512 s = _mm512_set1_ps(scale * 256.0f);
      for (int64_t i = t0; i < t0 + kFp8Tile; i += 32) {
        const __m512 lo = _mm512_mul_ps(Vec::fp8_pairs(tok + i), s);
        const __m512 hi = _mm512_mul_ps(Vec::fp8_pairs(tok + i + 16), s);
        __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
        _mm512_storeu_si512(row + i, reinterpret_cast<__m512i&>(v));
      }
    }
    memcpy(row + R, tok + c.fp8_rope_offset, size_t(D - R) * 2);
  }
  if (nt16 > nt) memset(dst + nt * D, 0, size_t((nt16 - nt) * D) * 2);
}

// One F32 row of n values to BF16 (round to nearest even), n even.
void f32_row_to_bf16(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i&>(v));
  }
  for (; i < n; i += 16) {
    __mmask16 k = __mmask16((1u << imin(16, n - i)) - 1);
    __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, src + i));
    _mm256_mask_storeu_epi16(dst + i, k, reinterpret_cast<__m256i&>(v));
  }
}

// One F32 row of n values to BF16 hi = bf16(x) and lo = bf16(x - hi), n even: hi + lo carries
// 16 significant bits of x (x - hi is exact in F32; lo rounds it to 8 bits).
void f32_row_split_bf16(const float* src, int64_t n, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 k = __mmask16((1u << imin(16, n - i)) - 1);
    __m512 x = _mm512_maskz_loadu_ps(k, src + i);
    __m256bh h = _mm512_cvtneps_pbh(x);
    __m512 hf = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<__m256i&>(h)), 16));
    __m256bh l = _mm512_cvtneps_pbh(_mm512_sub_ps(x, hf));
    _mm256_mask_storeu_epi16(hi + i, k, reinterpret_cast<__m256i&>(h));
    _mm256_mask_storeu_epi16(lo + i, k, reinterpret_cast<__m256i&>(l));
  }
}

// 16 x 16 transpose of 32-bit elements: in[i] holds row i (columns 0..15); out[c] gets column c
// (rows 0..15). Unpacks within 128-bit lanes, then a 4 x 4 transpose of the lanes.
inline void transpose16(const __m512i in[16], __m512i out[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(in[i], in[i + 1]);      // lane l: a0 b0 a1 b1
    t[i + 1] = _mm512_unpackhi_epi32(in[i], in[i + 1]);  // lane l: a2 b2 a3 b3
  }
  // u[4g + k], lane l: column 4l + k of rows 4g .. 4g+3.
  for (int g = 0; g < 4; ++g) {
    const __m512i* tg = t + 4 * g;
    u[4 * g + 0] = _mm512_unpacklo_epi64(tg[0], tg[2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(tg[0], tg[2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(tg[1], tg[3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(tg[1], tg[3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
    out[k] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    out[4 + k] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    out[8 + k] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    out[12 + k] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// Rows src[0 .. 16) of Dp BF16 pairs each (null: a zero row) -> dst[dp][0 .. 16), row stride M.
void transpose_rows(const uint32_t* const src[16], int64_t Dp, int64_t M, uint32_t* dst) {
  for (int64_t dp0 = 0; dp0 < Dp; dp0 += 16) {
    const int64_t n = imin(16, Dp - dp0);
    const __mmask16 k = __mmask16((1u << n) - 1);
    __m512i in[16], out[16];
    for (int i = 0; i < 16; ++i) {
      in[i] = src[i] ? _mm512_maskz_loadu_epi32(k, src[i] + dp0) : _mm512_setzero_si512();
    }
    transpose16(in, out);
    for (int64_t j = 0; j < n; ++j) _mm512_store_si512(dst + (dp0 + j) * M, out[j]);
  }
}

// Q rows -> qp [Dp][M] (pairs along dim, rows along the lanes), and with q_split the residuals
// -> qlo [Dp][M]; padding rows zero. 16 rows at a time: converted to BF16 rows, transposed.
void pack_q(const Piece& pc, const Ctx& c, int64_t rows, bool split, Work& w) {
  const int64_t D = c.dim;
  for (int64_t r0 = 0; r0 < w.M; r0 += 16) {
    const uint32_t* hi[16];
    const uint32_t* lo[16];
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t r = r0 + i;
      hi[i] = lo[i] = nullptr;
      if (r >= rows) continue;
      uint16_t* h = w.qrow + i * D;
      uint16_t* l = w.qrow + (16 + i) * D;
      if (pc.q_bf16) {
        hi[i] = reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(pc.q) + r * D);
      } else if (split) {
        f32_row_split_bf16(static_cast<const float*>(pc.q) + r * D, D, h, l);
        hi[i] = reinterpret_cast<const uint32_t*>(h);
        lo[i] = reinterpret_cast<const uint32_t*>(l);
      } else {
        f32_row_to_bf16(static_cast<const float*>(pc.q) + r * D, D, h);
        hi[i] = reinterpret_cast<const uint32_t*>(h);
      }
    }
    transpose_rows(hi, w.Dp, w.M, w.qp + r0);
    if (split) transpose_rows(lo, w.Dp, w.M, w.qlo + r0);
  }
}

// The group whose queries the calling thread packed last: another piece of it in the same call
// (split_blocks cuts a prefill group into several) reuses qp / qlo as they are in the scratch.
struct PackedQ {
  uint64_t call_id;
  const void* q;
  int64_t rows;
  const uint32_t* qp;
  bool split;
};
thread_local PackedQ t_packed = {0, nullptr, 0, nullptr, false};

// S[t][z*16..] for tokens [0, nt16) and row vectors [z0, z0 + MB), TB tokens at a time. SPLIT
// adds the residual queries' dot products into the same accumulators.
template <int MB, int TB, bool SPLIT>
void qk(const Work& w, const uint16_t* kblk, int64_t nt16, int64_t z0) {
  const int64_t Dp = w.Dp, M = w.M;
  const uint32_t* kp = reinterpret_cast<const uint32_t*>(kblk);
  for (int64_t t = 0; t < nt16; t += TB) {
    __m512 acc[TB][MB];
    for (int i = 0; i < TB; ++i)
      for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_setzero_ps();
    const uint32_t* krow = kp + t * Dp;
    const uint32_t* q = w.qp + z0 * 16;
    const uint32_t* ql = w.qlo + z0 * 16;
    for (int64_t dp = w.dp0; dp < Dp; ++dp) {
      __m512bh qv[MB], qlv[MB];
      for (int j = 0; j < MB; ++j) qv[j] = as_bh(_mm512_load_si512(q + dp * M + 16 * j));
      if (SPLIT) {
        for (int j = 0; j < MB; ++j) qlv[j] = as_bh(_mm512_load_si512(ql + dp * M + 16 * j));
      }
      for (int i = 0; i < TB; ++i) {
        __m512bh kb = as_bh(_mm512_set1_epi32(int(krow[i * Dp + dp])));
        for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], qv[j], kb);
        if (SPLIT) {
          for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], qlv[j], kb);
        }
      }
    }
    for (int i = 0; i < TB; ++i)
      for (int j = 0; j < MB; ++j) _mm512_store_ps(w.s + (t + i) * M + (z0 + j) * 16, acc[i][j]);
  }
}

// Masks, rescales and exponentiates the tile's scores; updates m, l, alpha; writes P pairs.
// Tokens [nt, 2 * ntp) are past the end of the sequence (their lim mask drops them).
void softmax_tile(Work& w, int64_t t0, int64_t ntp, float scale_log2, bool split) {
  const __m512 sc = _mm512_set1_ps(scale_log2);
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  const int64_t M = w.M;
  for (int64_t z = 0; z < w.Mz; ++z) {
    const __m512i lim = _mm512_load_si512(w.lim + z * 16);
    __m512 mx = ninf;
    if (_mm512_cmpgt_epi32_mask(lim, _mm512_set1_epi32(int(t0 + 2 * ntp - 1))) == 0xffff) {
      // Every row of the vector sees the whole tile: no mask.
      for (int64_t t = 0; t < 2 * ntp; ++t) {
        float* sp = w.s + t * M + z * 16;
        const __m512 v = _mm512_mul_ps(_mm512_load_ps(sp), sc);
        _mm512_store_ps(sp, v);
        mx = _mm512_max_ps(mx, v);
      }
    } else {
      for (int64_t t = 0; t < 2 * ntp; ++t) {
        float* sp = w.s + t * M + z * 16;
        __mmask16 vis = _mm512_cmpgt_epi32_mask(lim, _mm512_set1_epi32(int(t0 + t)));
        __m512 v = _mm512_mask_mul_ps(ninf, vis, _mm512_load_ps(sp), sc);
        _mm512_store_ps(sp, v);
        mx = _mm512_max_ps(mx, v);
      }
    }
    const __m512 m_old = _mm512_load_ps(w.m + z * 16);
    const __m512 m_new = _mm512_max_ps(m_old, mx);
    // A row that has seen nothing yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
    const __m512 mu = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m_new, ninf, _CMP_EQ_OQ), m_new,
                                           _mm512_setzero_ps());
    const __m512 alpha = exp2_ps(_mm512_sub_ps(m_old, mu));
    _mm512_store_ps(w.m + z * 16, m_new);
    _mm512_store_ps(w.alpha + z * 16, alpha);
    __m512 lsum = _mm512_setzero_ps();
    for (int64_t tp = 0; tp < ntp; ++tp) {
      __m512 p0 = exp2_ps(_mm512_sub_ps(_mm512_load_ps(w.s + (2 * tp) * M + z * 16), mu));
      __m512 p1 = exp2_ps(_mm512_sub_ps(_mm512_load_ps(w.s + (2 * tp + 1) * M + z * 16), mu));
      __m256bh b0 = _mm512_cvtneps_pbh(p0), b1 = _mm512_cvtneps_pbh(p1);
      __m512i e0 = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i&>(b0));
      __m512i e1 = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i&>(b1));
      _mm512_store_si512(w.pp + tp * M + z * 16, _mm512_or_si512(e0, _mm512_slli_epi32(e1, 16)));
      // l sums the rounded weights, so o is exactly normalised by the weights P V used.
      const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(e0, 16));
      const __m512 h1 = _mm512_castsi512_ps(_mm512_slli_epi32(e1, 16));
      lsum = _mm512_add_ps(lsum, h0);
      lsum = _mm512_add_ps(lsum, h1);
      if (split) {
        __m256bh c0 = _mm512_cvtneps_pbh(_mm512_sub_ps(p0, h0));
        __m256bh c1 = _mm512_cvtneps_pbh(_mm512_sub_ps(p1, h1));
        __m512i f0 = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i&>(c0));
        __m512i f1 = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i&>(c1));
        _mm512_store_si512(w.pplo + tp * M + z * 16,
                           _mm512_or_si512(f0, _mm512_slli_epi32(f1, 16)));
        lsum = _mm512_add_ps(lsum, _mm512_castsi512_ps(_mm512_slli_epi32(f0, 16)));
        lsum = _mm512_add_ps(lsum, _mm512_castsi512_ps(_mm512_slli_epi32(f1, 16)));
      }
    }
    const __m512 l_old = _mm512_load_ps(w.l + z * 16);
    _mm512_store_ps(w.l + z * 16, _mm512_fmadd_ps(l_old, alpha, lsum));
  }
}

// V token pairs for latent columns [c_lo, c_hi) (multiples of 32): vp[tp][32c .. 32c+31] =
// unpacklo/hi of K[2tp][32c..] and K[2tp+1][32c..]; rows at or past nt are zero (their slots
// may hold anything, even NaN bit patterns).
void build_vp(Work& w, const uint16_t* kblk, int64_t nt, int64_t ntp, int64_t c_lo, int64_t c_hi) {
  const int64_t D = w.D;
  for (int64_t tp = 0; tp < ntp; ++tp) {
    const int64_t t = 2 * tp;
    const uint16_t* a = kblk + t * D;
    const uint16_t* b = kblk + (t + 1) * D;
    const bool a_ok = t < nt, b_ok = t + 1 < nt;
    uint32_t* dst = w.vp + tp * w.ldv;
    for (int64_t c = c_lo; c < c_hi; c += 32) {
      __m512i va = a_ok ? _mm512_loadu_si512(a + c) : _mm512_setzero_si512();
      __m512i vb = b_ok ? _mm512_loadu_si512(b + c) : _mm512_setzero_si512();
      _mm512_store_si512(dst + c, _mm512_unpacklo_epi16(va, vb));
      _mm512_store_si512(dst + c + 16, _mm512_unpackhi_epi16(va, vb));
    }
  }
}

// O[r0..r0+RB)[c0*16 .. (c0+CB)*16) = alpha * O + sum_tp P[tp][r] V[tp]; SPLIT adds the
// residual weights' products.
template <int RB, int CB, bool SPLIT>
void pv(Work& w, int64_t r0, int64_t c0, int64_t ntp, bool first) {
  const int64_t R = w.R, M = w.M;
  __m512 acc[RB][CB];
  for (int i = 0; i < RB; ++i) {
    float* orow = w.o + (r0 + i) * R + c0 * 16;
    if (first) {
      for (int j = 0; j < CB; ++j) acc[i][j] = _mm512_setzero_ps();
    } else {
      __m512 a = _mm512_set1_ps(w.alpha[r0 + i]);
      for (int j = 0; j < CB; ++j) acc[i][j] = _mm512_mul_ps(_mm512_load_ps(orow + 16 * j), a);
    }
  }
  const uint32_t* v = w.vp + c0 * 16;
  const uint32_t* p = w.pp + r0;
  const uint32_t* pl = w.pplo + r0;
  const char* pf = w.pf;
  for (int64_t tp = 0; tp < ntp; ++tp) {
    // Two lines of the next block per token-pair step, spread over the tile's P V: its scores
    // then read L2, not DRAM (decode at batch > 1 works on more than the L3 holds).
    if (pf < w.pf_end) {
      _mm_prefetch(pf, _MM_HINT_T1);
      _mm_prefetch(pf + 64, _MM_HINT_T1);
      pf += 128;
    }
    __m512bh vv[CB];
    for (int j = 0; j < CB; ++j) vv[j] = as_bh(_mm512_load_si512(v + tp * w.ldv + 16 * j));
    for (int i = 0; i < RB; ++i) {
      __m512bh pb = as_bh(_mm512_set1_epi32(int(p[tp * M + i])));
      for (int j = 0; j < CB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], vv[j], pb);
      if (SPLIT) {
        __m512bh plb = as_bh(_mm512_set1_epi32(int(pl[tp * M + i])));
        for (int j = 0; j < CB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], vv[j], plb);
      }
    }
  }
  for (int i = 0; i < RB; ++i) {
    float* orow = w.o + (r0 + i) * R + c0 * 16;
    for (int j = 0; j < CB; ++j) _mm512_store_ps(orow + 16 * j, acc[i][j]);
  }
  w.pf = pf;
}

template <int CB, bool SPLIT>
void pv_rows(Work& w, int64_t c0, int64_t ntp, bool first) {
  constexpr int kRB = 6;
  int64_t r0 = 0;
  for (; r0 + kRB <= w.M; r0 += kRB) pv<kRB, CB, SPLIT>(w, r0, c0, ntp, first);
  switch (w.M - r0) {
    case 5:
      pv<5, CB, SPLIT>(w, r0, c0, ntp, first);
      break;
    case 4:
      pv<4, CB, SPLIT>(w, r0, c0, ntp, first);
      break;
    case 3:
      pv<3, CB, SPLIT>(w, r0, c0, ntp, first);
      break;
    case 2:
      pv<2, CB, SPLIT>(w, r0, c0, ntp, first);
      break;
    case 1:
      pv<1, CB, SPLIT>(w, r0, c0, ntp, first);
      break;
    default:
      break;
  }
}

// P V over the latent 64 columns at a time, each group's V pairs built just before its rows run
// (8 KB per group stays in L1; the whole block's 64 KB went to L2 and was read back per row
// block: 15-25% of a 16-head decode). Same products in the same order.
template <bool SPLIT>
void pv_all(Work& w, const uint16_t* kblk, int64_t nt, int64_t ntp, bool first) {
  int64_t c0 = 0;
  for (; c0 + 4 <= w.R / 16; c0 += 4) {
    build_vp(w, kblk, nt, ntp, c0 * 16, (c0 + 4) * 16);
    pv_rows<4, SPLIT>(w, c0, ntp, first);
  }
  if (w.R / 16 - c0 == 2) {
    build_vp(w, kblk, nt, ntp, c0 * 16, (c0 + 2) * 16);
    pv_rows<2, SPLIT>(w, c0, ntp, first);
  }
}

template <bool SPLIT>
void qk_all(const Work& w, const uint16_t* kblk, int64_t nt16) {
  int64_t z = 0;
  for (; z + 3 <= w.Mz; z += 3) qk<3, 8, SPLIT>(w, kblk, nt16, z);
  if (w.Mz - z == 2) qk<2, 8, SPLIT>(w, kblk, nt16, z);
  if (w.Mz - z == 1) qk<1, 16, SPLIT>(w, kblk, nt16, z);
}

// Writes o = O / l in natural order and lse for the piece's real rows.
void finish(const Work& w, const Piece& pc, int64_t rows) {
  // Inverse of the unpack order: in a 32-value chunk, lo holds values {0-3, 8-11, 16-19, 24-27},
  // hi holds {4-7, 12-15, 20-23, 28-31} (per 128-bit lane: 4 pairs each).
  alignas(64) int32_t idx[32];
  for (int v = 0; v < 32; ++v) idx[v] = ((v % 8) < 4 ? 0 : 16) + 4 * (v / 8) + v % 4;
  const __m512i i0 = _mm512_load_si512(idx), i1 = _mm512_load_si512(idx + 16);
  const int64_t R = w.R;
  for (int64_t r = 0; r < rows; ++r) {
    const float l = w.l[r];
    const __m512 inv = _mm512_set1_ps(l > 0 ? 1.0f / l : 0.0f);
    const float* src = w.o + r * R;
    float* dst = pc.o + r * R;
    for (int64_t c = 0; c < R; c += 32) {
      __m512 lo = _mm512_load_ps(src + c), hi = _mm512_load_ps(src + c + 16);
      _mm512_storeu_ps(dst + c, _mm512_mul_ps(_mm512_permutex2var_ps(lo, i0, hi), inv));
      _mm512_storeu_ps(dst + c + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo, i1, hi), inv));
    }
    if (pc.lse) {
      pc.lse[r] = l > 0 ? (w.m[r] + log2f(l)) * 0.69314718055994531f : -__builtin_inff();
    }
  }
}

#ifdef __AMX_TILE__
// The AMX form of steps 1 and 4 (docs/kernels-amx.md, "MLA"): the same operands, already in the
// tile unit's layouts. S^T is computed as K Q^T: A = 16 cached tokens x 32 dims read in place
// (row stride D), B = qp's 16 dim pairs x 16 rows; C = S[t][16 rows]. P V: A = P transposed to
// [rows][token pairs] (ppt), B = vp's 16 token pairs x 16 latent columns, C = O's 16 rows x 16
// columns, loaded from O (after O *= alpha) and stored back. Every tile register is 16 x 64
// bytes; needs D % 32 == 0 (whole K steps) and kv_lora_rank % 32 == 0.

// Up to n more lines of the next block into L2: the driver spreads the block over this block's
// tile steps, as the vector kernel spreads it over its P V.
inline void prefetch_next(Work& w, int64_t n) {
  for (int64_t i = 0; i < n && w.pf < w.pf_end; ++i, w.pf += 64) _mm_prefetch(w.pf, _MM_HINT_T1);
}

#define MOESERVE_MLA_QK(i)                               \
  if (nT > i) {                                          \
    _tile_loadd(4, kblk + (16 * i) * D + 32 * q, D * 2); \
    _tile_dpbf16ps(i, 4, 5);                             \
    if (SPLIT) _tile_dpbf16ps(i, 4, 6);                  \
  }
#define MOESERVE_MLA_QK_STORE(i) \
  if (nT > i) _tile_stored(i, s + (16 * i) * M, M * 4);

template <bool SPLIT>
void qk_amx(Work& w, const uint16_t* kblk, int64_t nt16, int64_t pf_per_step) {
  const int64_t D = w.D, M = w.M, nT = nt16 / 16, steps = w.Dp / 16;
  for (int64_t z = 0; z < w.Mz; ++z) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t q = w.dp0 / 16; q < steps; ++q) {
      prefetch_next(w, pf_per_step);
      _tile_loadd(5, w.qp + 16 * q * M + 16 * z, M * 4);
      if (SPLIT) _tile_loadd(6, w.qlo + 16 * q * M + 16 * z, M * 4);
      MOESERVE_MLA_QK(0)
      MOESERVE_MLA_QK(1)
      MOESERVE_MLA_QK(2)
      MOESERVE_MLA_QK(3)
    }
    float* s = w.s + 16 * z;
    MOESERVE_MLA_QK_STORE(0)
    MOESERVE_MLA_QK_STORE(1)
    MOESERVE_MLA_QK_STORE(2)
    MOESERVE_MLA_QK_STORE(3)
  }
}
#undef MOESERVE_MLA_QK
#undef MOESERVE_MLA_QK_STORE

// pp [tp][M] -> ppt [M][kTile / 2] for token pairs [0, round_up(ntp, 16)), zero past ntp.
void transpose_p(const Work& w, int64_t ntp, const uint32_t* pp, uint32_t* ppt) {
  const int64_t M = w.M;
  for (int64_t z = 0; z < w.Mz; ++z) {
    for (int64_t s = 0; 16 * s < ntp; ++s) {
      __m512i in[16], out[16];
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t tp = 16 * s + i;
        in[i] = tp < ntp ? _mm512_load_si512(pp + tp * M + 16 * z) : _mm512_setzero_si512();
      }
      transpose16(in, out);
      for (int64_t r = 0; r < 16; ++r)
        _mm512_store_si512(ppt + (16 * z + r) * (kTile / 2) + 16 * s, out[r]);
    }
  }
}

#define MOESERVE_MLA_PV(j)                                            \
  if (nc > j) {                                                       \
    _tile_loadd(6, w.vp + 16 * s * w.ldv + (c0 + j) * 16, w.ldv * 4); \
    _tile_dpbf16ps(j, 4, 6);                                          \
    if (SPLIT) _tile_dpbf16ps(j, 5, 6);                               \
  }
#define MOESERVE_MLA_PV_IO(j, op) \
  if (nc > j) op(j, o + 16 * j, R * 4);

template <bool SPLIT>
void pv_amx(Work& w, const uint16_t* kblk, int64_t nt, int64_t ntp, bool first,
            int64_t pf_per_step) {
  const int64_t R = w.R, ks = (ntp + 15) / 16;
  transpose_p(w, ntp, w.pp, w.ppt);
  if (SPLIT) transpose_p(w, ntp, w.pplo, w.pptlo);
  for (int64_t c0 = 0; c0 < R / 16; c0 += 4) {
    const int64_t nc = imin(4, R / 16 - c0);
    build_vp(w, kblk, nt, ntp, c0 * 16, (c0 + nc) * 16);
    // Token pairs past ntp up to the K step: zero (P is zero there; 0 x NaN would not be).
    for (int64_t tp = ntp; tp < 16 * ks; ++tp)
      memset(w.vp + tp * w.ldv + c0 * 16, 0, size_t(nc * 16) * 4);
    for (int64_t z = 0; z < w.Mz; ++z) {
      prefetch_next(w, pf_per_step);
      float* o = w.o + 16 * z * R + c0 * 16;
      if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      } else {
        for (int64_t r = 0; r < 16; ++r) {
          const __m512 a = _mm512_set1_ps(w.alpha[16 * z + r]);
          for (int64_t j = 0; j < nc; ++j) {
            float* d = o + r * R + 16 * j;
            _mm512_store_ps(d, _mm512_mul_ps(_mm512_load_ps(d), a));
          }
        }
        MOESERVE_MLA_PV_IO(0, _tile_loadd)
        MOESERVE_MLA_PV_IO(1, _tile_loadd)
        MOESERVE_MLA_PV_IO(2, _tile_loadd)
        MOESERVE_MLA_PV_IO(3, _tile_loadd)
      }
      for (int64_t s = 0; s < ks; ++s) {
        _tile_loadd(4, w.ppt + 16 * z * (kTile / 2) + 16 * s, (kTile / 2) * 4);
        if (SPLIT) _tile_loadd(5, w.pptlo + 16 * z * (kTile / 2) + 16 * s, (kTile / 2) * 4);
        MOESERVE_MLA_PV(0)
        MOESERVE_MLA_PV(1)
        MOESERVE_MLA_PV(2)
        MOESERVE_MLA_PV(3)
      }
      MOESERVE_MLA_PV_IO(0, _tile_stored)
      MOESERVE_MLA_PV_IO(1, _tile_stored)
      MOESERVE_MLA_PV_IO(2, _tile_stored)
      MOESERVE_MLA_PV_IO(3, _tile_stored)
    }
  }
}
#undef MOESERVE_MLA_PV
#undef MOESERVE_MLA_PV_IO
#endif  // __AMX_TILE__

// One piece (steps 0-4 above); with kAmx steps 1 and 4 run on the tile unit.
template <bool kAmx>
void piece_bf16(const Ctx& c, const Piece& pc) {
  const int64_t rows = pc.n_q * c.heads;
  const int64_t M = round_up(rows, 16);
  Work w = carve(M, c.kv_lora_rank, c.dim, c.fp8, kAmx);
  w.dp0 = c.q_zero_pairs;
  const bool q_split = c.q_split && !pc.q_bf16;
  PackedQ& pq = t_packed;
  if (!(pq.call_id == c.call_id && pq.q == pc.q && pq.rows == rows && pq.qp == w.qp &&
        pq.split == q_split)) {
    pack_q(pc, c, rows, q_split, w);
    pq = PackedQ{c.call_id, pc.q, rows, w.qp, q_split};
  }
  for (int64_t r = 0; r < M; ++r) {
    w.lim[r] = r < rows ? int32_t(pc.first_pos + r / c.heads + 1) : 0;
    w.m[r] = -__builtin_inff();
    w.l[r] = 0.0f;
  }
  const float scale_log2 = c.softmax_scale * 1.4426950408889634f;
  // Tokens the group's last query sees: no row sees past it (it is <= context_len), so a tile
  // is cut there, not at the end of the context (the diagonal tile of a prefill chunk).
  const int64_t seen = pc.first_pos + pc.n_q;
  for (int64_t b = pc.b0; b < pc.b1; ++b) {
    const int64_t t0 = b * kTile;
    const int64_t nt = imin(kTile, seen - t0);
    const int64_t nt16 = round_up(nt, 16), ntp = (nt + 1) / 2;
    const uint8_t* blk = c.blocks + int64_t(pc.block_table[b]) * c.block_stride;
    const uint16_t* kblk = reinterpret_cast<const uint16_t*>(blk);  // [64][D] BF16
    if (c.fp8) {
      dequantize_fp8_block(c, blk, nt, nt16, w.kdq);
      kblk = w.kdq;
    }
    // Prefetch (to L2, during P V) the next block of the piece, or after the last one the first
    // block of the thread's next piece.
    if (b + 1 < pc.b1) {
      const int64_t nt_next = imin(kTile, seen - t0 - kTile);
      w.pf =
          reinterpret_cast<const char*>(c.blocks + int64_t(pc.block_table[b + 1]) * c.block_stride);
      w.pf_end = w.pf + nt_next * c.token_bytes;
    } else {
      w.pf = static_cast<const char*>(pc.next_block);
      w.pf_end = w.pf + (pc.next_block ? pc.next_bytes : 0);
    }
    const bool first = b == pc.b0;
#ifdef __AMX_TILE__
    if constexpr (kAmx) {
      // The next block's lines spread over the tile steps of this one.
      const int64_t steps = w.Mz * (w.Dp / 16 + (w.R + 63) / 64);
      const int64_t pf_per_step = ((w.pf_end - w.pf) / 64 + steps - 1) / steps;
      q_split ? qk_amx<true>(w, kblk, nt16, pf_per_step)
              : qk_amx<false>(w, kblk, nt16, pf_per_step);
      softmax_tile(w, t0, ntp, scale_log2, c.p_split);
      c.p_split ? pv_amx<true>(w, kblk, nt, ntp, first, pf_per_step)
                : pv_amx<false>(w, kblk, nt, ntp, first, pf_per_step);
      continue;
    }
#endif
    q_split ? qk_all<true>(w, kblk, nt16) : qk_all<false>(w, kblk, nt16);
    softmax_tile(w, t0, ntp, scale_log2, c.p_split);
    c.p_split ? pv_all<true>(w, kblk, nt, ntp, first) : pv_all<false>(w, kblk, nt, ntp, first);
  }
  finish(w, pc, rows);
}
