// The FP32 piece kernel of mla_decode, shared by the AVX-512F and AVX2 levels
// (mla_decode_avx512f.cpp, mla_decode_avx2.cpp): one piece (a group of query rows x a range of
// cache blocks) per call, one 64-token cache block per tile, the BF16 level's blocking with F32
// FMAs instead of BF16 dot products (docs/kernels-mla.md). Per tile:
//   0. Kf = the block's first nt tokens widened to F32 (exact: a BF16 value is the high half of
//      its F32; an FP8 token's values are e4m3 x a power of two), [64][ldk]: K for the scores
//      and, in its first kv_lora_rank columns, V.
//   1. S[t][row] = <Q[row], K[t]>: rows (query x head) in the lanes, Q packed once per piece as
//      F32 [dim][M]; each Kf[t][d] is broadcast once per register block, so every cached value
//      is read once for all rows.
//   2. Online softmax in FP32 (base 2, the scale folded into the exponent), causal and
//      past-the-end tokens masked per lane; P stays F32 (in place of S).
//   3. O[row][:] = alpha * O + P V: kv_lora_rank in the lanes, P broadcast per row.
// Numerics: products of F32 queries and exact cache values, FP32 sums, FP32 P: the reference's
// arithmetic in another order (o within ~1e-6 of the values' magnitude, lse ~1e-6 relative).
// While P V runs, the next block of the piece (after its last block, the first block of the
// thread's next piece) is prefetched to L2 (one line per token step).
//
// How to use: include only from those two files, inside their anonymous namespace in
// moeserve::mla_detail, after <immintrin.h>, <math.h>, <stdlib.h>, <string.h>, <cstdint>,
// kernels/mla_decode_internal.h and a `struct Vec` that gives the vector width:
//   T; kLanes; kRegs (16 or 32: picks the register blocks); zero(); set1(float);
//   load/store (aligned float*), storeu; bcast(const float*); add, sub, mul, max, fmadd(a, b, c);
//   exp2(x) (2^x for x <= 0; -inf gives exactly 0, never NaN);
//   visible(const int32_t* lim, int64_t t, T v): v in lanes with lim > t, -inf elsewhere;
//   zero_where_ninf(T m): 0 in lanes where m = -inf, m elsewhere;
//   widen(const uint16_t* bf16, float* dst, int64_t n): dst[i] = the F32 value of bf16[i];
//   fp8_pairs(const uint8_t* p): kLanes e4m3 bytes as F32 times 2^-8, in order.
// Everything here then has internal linkage and is compiled for that file's ISA only (the
// reason this is not ordinary shared inline code: cpu_features.h). No includes of its own.
#pragma once

constexpr int64_t kTile = 64;  // tokens per tile = one cache block
constexpr int64_t kL = Vec::kLanes;

inline int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}
inline int64_t round_up(int64_t a, int64_t m) {
  return (a + m - 1) / m * m;
}

// Pointers into the calling thread's scratch (thread_scratch_parts), carved per piece.
struct Work {
  int64_t M, Mz, R, D;
  int64_t ldk;     // row stride of kf: D rounded up to 16 floats (aligned rows)
  float* qf;       // [D][M] Q, rows in the lanes; padding rows zero
  float* kf;       // [kTile][ldk] the block's tokens as F32
  float* s;        // [kTile][M] scores, then base-2 logits, then P
  float* o;        // [M][R] unnormalised output
  float* m;        // [M] running max (base-2 logits)
  float* l;        // [M] running sum of P
  float* alpha;    // [M] rescale of O for the current tile
  int32_t* lim;    // [M] tokens visible to each row (0 for padding rows)
  const char* pf;  // next cache line of the next block to prefetch, up to pf_end
  const char* pf_end;
};

Work carve(int64_t M, int64_t R, int64_t D) {
  Work w{};
  w.M = M;
  w.Mz = M / kL;
  w.R = R;
  w.D = D;
  w.ldk = round_up(D, 16);
  const size_t sz[8] = {size_t(D * M) * 4,     size_t(kTile * w.ldk) * 4,
                        size_t(kTile * M) * 4, size_t(M * R) * 4,
                        size_t(M) * 4,         size_t(M) * 4,
                        size_t(M) * 4,         size_t(M) * 4};
  char* part[8];
  thread_scratch_parts(sz, 8, part);
  w.qf = reinterpret_cast<float*>(part[0]);
  w.kf = reinterpret_cast<float*>(part[1]);
  w.s = reinterpret_cast<float*>(part[2]);
  w.o = reinterpret_cast<float*>(part[3]);
  w.m = reinterpret_cast<float*>(part[4]);
  w.l = reinterpret_cast<float*>(part[5]);
  w.alpha = reinterpret_cast<float*>(part[6]);
  w.lim = reinterpret_cast<int32_t*>(part[7]);
  return w;
}

// One cached token -> dim F32 values at dst (aligned), exactly: BF16 widened, or FP8 (kv_token.h)
// as e4m3 x its tile's power-of-two scale (fp8_pairs gives e4m3 x 2^-8 without forming F32
// subnormals; times scale x 2^8 that is the reference's fp8e4m3_to_f32(q) * scale, rounded once)
// and the BF16 rope key widened.
void widen_token(const Ctx& c, const uint8_t* tok, float* dst) {
  if (!c.fp8) {
    Vec::widen(reinterpret_cast<const uint16_t*>(tok), dst, c.dim);
    return;
  }
  for (int64_t t0 = 0; t0 < c.kv_lora_rank; t0 += kFp8Tile) {
    float scale;
    memcpy(&scale, tok + c.kv_lora_rank + t0 / kFp8Tile * 4, 4);
    const typename Vec::T s = Vec::set1(scale * 256.0f);
    for (int64_t i = t0; i < t0 + kFp8Tile; i += kL) {
      Vec::store(dst + i, Vec::mul(Vec::fp8_pairs(tok + i), s));
    }
  }
  Vec::widen(reinterpret_cast<const uint16_t*>(tok + c.fp8_rope_offset), dst + c.kv_lora_rank,
             c.dim - c.kv_lora_rank);
}

// Q rows [rows][D] (BF16 bits or F32) -> qf [D][M]; padding rows zero.
void pack_q(const Piece& pc, int64_t rows, Work& w) {
  const int64_t D = w.D, M = w.M;
  for (int64_t r = 0; r < rows; ++r) {
    if (pc.q_bf16) {
      const uint16_t* src = static_cast<const uint16_t*>(pc.q) + r * D;
      for (int64_t d = 0; d < D; ++d) {
        const uint32_t bits = uint32_t(src[d]) << 16;
        memcpy(&w.qf[d * M + r], &bits, 4);
      }
    } else {
      const float* src = static_cast<const float*>(pc.q) + r * D;
      for (int64_t d = 0; d < D; ++d) w.qf[d * M + r] = src[d];
    }
  }
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t r = rows; r < M; ++r) w.qf[d * M + r] = 0.0f;
  }
}

// S[t0 .. t0+TB)[z0*L .. (z0+MB)*L) = Q K^T: MB row vectors x TB tokens of accumulators.
template <int MB, int TB>
void qk_block(const Work& w, int64_t z0, int64_t t0) {
  using T = typename Vec::T;
  const int64_t D = w.D, M = w.M, ldk = w.ldk;
  T acc[TB][MB];
  for (int i = 0; i < TB; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = Vec::zero();
  const float* q = w.qf + z0 * kL;
  const float* k = w.kf + t0 * ldk;
  for (int64_t d = 0; d < D; ++d) {
    T qv[MB];
    for (int j = 0; j < MB; ++j) qv[j] = Vec::load(q + d * M + j * kL);
    for (int i = 0; i < TB; ++i) {
      const T kb = Vec::bcast(k + i * ldk + d);
      for (int j = 0; j < MB; ++j) acc[i][j] = Vec::fmadd(qv[j], kb, acc[i][j]);
    }
  }
  for (int i = 0; i < TB; ++i)
    for (int j = 0; j < MB; ++j) Vec::store(w.s + (t0 + i) * M + (z0 + j) * kL, acc[i][j]);
}

// Tokens [t, nt) for row vectors [z0, z0 + MB): blocks of TB, the rest in halving blocks.
template <int MB, int TB>
void qk_tokens(const Work& w, int64_t z0, int64_t t, int64_t nt) {
  for (; t + TB <= nt; t += TB) qk_block<MB, TB>(w, z0, t);
  if constexpr (TB > 1) {
    if (t < nt) qk_tokens<MB, TB / 2>(w, z0, t, nt);
  }
}

void qk_all(const Work& w, int64_t nt) {
  int64_t z = 0;
  if constexpr (Vec::kRegs >= 32) {  // 24 accumulators
    for (; z + 3 <= w.Mz; z += 3) qk_tokens<3, 8>(w, z, 0, nt);
    if (w.Mz - z == 2) qk_tokens<2, 12>(w, z, 0, nt);
    if (w.Mz - z == 1) qk_tokens<1, 16>(w, z, 0, nt);
  } else {  // 12 accumulators
    for (; z + 2 <= w.Mz; z += 2) qk_tokens<2, 6>(w, z, 0, nt);
    if (w.Mz - z == 1) qk_tokens<1, 12>(w, z, 0, nt);
  }
}

// Masks and rescales the tile's scores, exponentiates them into P (in place), updates m, l and
// alpha. Only tokens [0, nt) exist; a row's lim masks the ones past its position.
void softmax_tile(Work& w, int64_t t0, int64_t nt, float scale_log2) {
  using T = typename Vec::T;
  const T sc = Vec::set1(scale_log2);
  const int64_t M = w.M;
  for (int64_t z = 0; z < w.Mz; ++z) {
    const int32_t* lim = w.lim + z * kL;
    T mx = Vec::set1(-__builtin_inff());
    for (int64_t t = 0; t < nt; ++t) {
      float* sp = w.s + t * M + z * kL;
      const T v = Vec::visible(lim, t0 + t, Vec::mul(Vec::load(sp), sc));
      Vec::store(sp, v);
      mx = Vec::max(mx, v);
    }
    const T m_old = Vec::load(w.m + z * kL);
    const T m_new = Vec::max(m_old, mx);
    // A row that has seen nothing yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
    const T mu = Vec::zero_where_ninf(m_new);
    const T alpha = Vec::exp2(Vec::sub(m_old, mu));
    Vec::store(w.m + z * kL, m_new);
    Vec::store(w.alpha + z * kL, alpha);
    T lsum = Vec::zero();
    for (int64_t t = 0; t < nt; ++t) {
      float* sp = w.s + t * M + z * kL;
      const T p = Vec::exp2(Vec::sub(Vec::load(sp), mu));
      Vec::store(sp, p);
      lsum = Vec::add(lsum, p);
    }
    Vec::store(w.l + z * kL, Vec::fmadd(Vec::load(w.l + z * kL), alpha, lsum));
  }
}

// O[r0 .. r0+RB)[c0*L .. (c0+CB)*L) = alpha * O + sum_t P[t][r] V[t]: RB rows x CB vectors.
template <int RB, int CB>
void pv_block(Work& w, int64_t r0, int64_t c0, int64_t nt, bool first) {
  using T = typename Vec::T;
  const int64_t R = w.R, M = w.M, ldk = w.ldk;
  T acc[RB][CB];
  for (int i = 0; i < RB; ++i) {
    const float* orow = w.o + (r0 + i) * R + c0 * kL;
    if (first) {
      for (int j = 0; j < CB; ++j) acc[i][j] = Vec::zero();
    } else {
      const T a = Vec::bcast(w.alpha + r0 + i);
      for (int j = 0; j < CB; ++j) acc[i][j] = Vec::mul(Vec::load(orow + j * kL), a);
    }
  }
  const float* v = w.kf + c0 * kL;
  const float* p = w.s + r0;
  const char* pf = w.pf;
  for (int64_t t = 0; t < nt; ++t) {
    // One line of the next block per token step, spread over the tile's compute: the next
    // widen then reads L2, not DRAM.
    if (pf < w.pf_end) {
      _mm_prefetch(pf, _MM_HINT_T1);
      pf += 64;
    }
    T vv[CB];
    for (int j = 0; j < CB; ++j) vv[j] = Vec::load(v + t * ldk + j * kL);
    for (int i = 0; i < RB; ++i) {
      const T pb = Vec::bcast(p + t * M + i);
      for (int j = 0; j < CB; ++j) acc[i][j] = Vec::fmadd(vv[j], pb, acc[i][j]);
    }
  }
  for (int i = 0; i < RB; ++i) {
    float* orow = w.o + (r0 + i) * R + c0 * kL;
    for (int j = 0; j < CB; ++j) Vec::store(orow + j * kL, acc[i][j]);
  }
  w.pf = pf;
}

// Rows [r, rows) for vectors [c0, c0 + CB): blocks of RB rows, the rest in halving blocks.
template <int RB, int CB>
void pv_rows(Work& w, int64_t r, int64_t rows, int64_t c0, int64_t nt, bool first) {
  for (; r + RB <= rows; r += RB) pv_block<RB, CB>(w, r, c0, nt, first);
  if constexpr (RB > 1) {
    if (r < rows) pv_rows<RB / 2, CB>(w, r, rows, c0, nt, first);
  }
}

// Vectors [c, R / L) of every real row (padding rows have P = 0 and are never written out).
template <int CB>
void pv_cols(Work& w, int64_t c, int64_t rows, int64_t nt, bool first) {
  constexpr int kRB = 6;  // 6 x CB accumulators: 24 zmm or 12 ymm
  for (; c + CB <= w.R / kL; c += CB) pv_rows<kRB, CB>(w, 0, rows, c, nt, first);
  if constexpr (CB > 1) {
    if (c < w.R / kL) pv_cols<CB / 2>(w, c, rows, nt, first);
  }
}

void pv_all(Work& w, int64_t rows, int64_t nt, bool first) {
  pv_cols<Vec::kRegs >= 32 ? 4 : 2>(w, 0, rows, nt, first);
}

// Writes o = O / l and lse for the piece's real rows.
void finish(const Work& w, const Piece& pc, int64_t rows) {
  const int64_t R = w.R;
  for (int64_t r = 0; r < rows; ++r) {
    const float l = w.l[r];
    const typename Vec::T inv = Vec::set1(l > 0 ? 1.0f / l : 0.0f);
    const float* src = w.o + r * R;
    float* dst = pc.o + r * R;
    for (int64_t c = 0; c < R; c += kL) Vec::storeu(dst + c, Vec::mul(Vec::load(src + c), inv));
    if (pc.lse) {
      pc.lse[r] = l > 0 ? (w.m[r] + log2f(l)) * 0.69314718055994531f : -__builtin_inff();
    }
  }
}

// The whole piece; needs kv_lora_rank % kL == 0 (mla_decode.cpp checks).
void piece_f32(const Ctx& c, const Piece& pc) {
  const int64_t rows = pc.n_q * c.heads;
  const int64_t M = round_up(rows, kL);
  Work w = carve(M, c.kv_lora_rank, c.dim);
  pack_q(pc, rows, w);
  for (int64_t r = 0; r < M; ++r) {
    w.lim[r] = r < rows ? int32_t(pc.first_pos + r / c.heads + 1) : 0;
    w.m[r] = -__builtin_inff();
    w.l[r] = 0.0f;
  }
  const float scale_log2 = c.softmax_scale * 1.4426950408889634f;
  for (int64_t b = pc.b0; b < pc.b1; ++b) {
    const int64_t t0 = b * kTile;
    const int64_t nt = imin(kTile, pc.context_len - t0);
    const uint8_t* kblk = c.blocks + int64_t(pc.block_table[b]) * c.block_stride;
    for (int64_t t = 0; t < nt; ++t) widen_token(c, kblk + t * c.token_bytes, w.kf + t * w.ldk);
    // Prefetch (to L2, during P V) the next block of the piece, or after the last one the first
    // block of the thread's next piece (the driver's hint).
    if (b + 1 < pc.b1) {
      const int64_t nt_next = imin(kTile, pc.context_len - t0 - kTile);
      w.pf =
          reinterpret_cast<const char*>(c.blocks + int64_t(pc.block_table[b + 1]) * c.block_stride);
      w.pf_end = w.pf + nt_next * c.token_bytes;
    } else {
      w.pf = static_cast<const char*>(pc.next_block);
      w.pf_end = w.pf + (pc.next_block ? pc.next_bytes : 0);
    }
    qk_all(w, nt);
    softmax_tile(w, t0, nt, scale_log2);
    pv_all(w, rows, nt, b == pc.b0);
  }
  finish(w, pc, rows);
}
