// The FP32-FMA panel kernel of gemm_fp8 (BF16 X) and gemm_fp8_f32x (F32 X), shared by their
// AVX-512F and AVX2 levels (gemm_fp8_avx512f.cpp, gemm_fp8_avx2.cpp, gemm_fp8_f32x_avx512f.cpp,
// gemm_fp8_f32x_avx2.cpp; the AVX-512 BF16 level of gemm_fp8 is gemm_fp8_avx512.cpp). For each
// 64-column panel and 128-wide K block, the tile is converted exactly to F32 (FP8, or BF16 tiles of
// PackedBf16Weight for gemm_fp8_f32x) and register blocks of up to kRows rows x kSliceVecs
// vectors (6 x 4 zmm: 24 accumulators; 4 x 2 ymm: 8) run FP32 FMAs over each slice of the tile's
// rows in turn (kSliceVecs vectors wide: 64 or 16 columns, or 32 or 8 in the pairs form below).
// The block scale multiplies each K block's partial sum once, as in all levels. Rows are taken in
// blocks whose X stays in L3 while every panel passes over it (docs/kernels-gemm.md).
//
// Two forms of the tile, a level's choice (Form::kPairs):
//  - rows: F32 tile [128 k][64 cols], exact values; lanes hold columns, each output one FMA per k
//    in order.
//  - pairs: the packed order kept ([64 k-pairs][64 cols][2]), FP8 through FP16 (each value times
//    2^-8, never an F32 subnormal; the 2^8 goes into the block scale); lanes hold (column, k
//    parity) partial sums, X is broadcast as a pair and the parities are added once per K block.
//    Since the tile is in byte order, it can also be converted in registers inside the FMA loop
//    (Form::kConvRows > 0: blocks of M <= kConvRows rows, the memory-bound case: W streams from
//    memory once and its conversion overlaps the FMAs), with the same arithmetic per row.
// Either way a row's result never depends on M (batch invariance); levels of one form and kernel
// give the same bits.
//
// How to use: include only from those four files, inside their anonymous namespace in
// moeserve::gemm_detail, after <immintrin.h>, <cstdint>, <cstdlib>, <cstring>,
// kernels/gemm_fp8_internal.h, the level's vector type (kernels/vec_avx512f.h or vec_avx2.h) and
// a `struct Form` with
//   kBf16X (X is BF16 job.x, widened per row block: gemm_fp8; else F32 job.xf: gemm_fp8_f32x),
//   kPairs, kConvRows (pairs form only; 0: never converted in registers).
// Everything here then has internal linkage and is compiled for that file's ISA only
// (cpu_features.h). No includes of its own.
#pragma once

constexpr int64_t kL = Vec::kLanes;
constexpr int kGroup = Form::kPairs ? 2 : 1;          // k values per column in a vector
constexpr int kRows = Vec::kRegs >= 32 ? 6 : 4;       // rows of a register block
constexpr int kSliceVecs = Vec::kRegs >= 32 ? 4 : 2;  // vectors per row of a register block
constexpr int64_t kSliceLen = kSliceVecs * kL;        // tile elements per slice and k group
constexpr int kSlices = int(kPanelCols * kGroup / kSliceLen);
constexpr float kWScale = Form::kPairs ? 256.0f : 1.0f;  // converted W = value / kWScale
static_assert(Form::kPairs || Form::kConvRows == 0, "registers convert only the packed order");
static_assert(Form::kConvRows <= kRows && !(Form::kBf16X && Form::kConvRows > 0));

// Tile (p, kb) -> dst F32 in the form's order (rows: [128 k][64 cols]; pairs: the packed order).
void convert_tile(const uint8_t* src, float* dst) {
  if constexpr (Form::kPairs) {
    for (int64_t i = 0; i < kTileBytes; i += kL) Vec::store(dst + i, Vec::fp8_pairs(src + i));
  } else {
    for (int64_t kp = 0; kp < kBlockK / 2; ++kp) {
      for (int64_t c = 0; c < kPanelCols; c += kL) {
        typename Vec::T even, odd;
        Vec::fp8_rows(src + kp * 2 * kPanelCols + 2 * c, even, odd);
        Vec::store(dst + 2 * kp * kPanelCols + c, even);
        Vec::store(dst + (2 * kp + 1) * kPanelCols + c, odd);
      }
    }
  }
}

// The same for a BF16 tile (PackedBf16Weight), each value exactly (not divided by kWScale).
void convert_tile_bf16(const uint16_t* src, float* dst) {
  if constexpr (Form::kPairs) {
    Vec::widen(src, dst, kTileBytes);
  } else {
    for (int64_t kp = 0; kp < kBlockK / 2; ++kp) {
      for (int64_t c = 0; c < kPanelCols; c += kL) {
        typename Vec::T even, odd;
        Vec::bf16_rows(src + kp * 2 * kPanelCols + 2 * c, even, odd);
        Vec::store(dst + 2 * kp * kPanelCols + c, even);
        Vec::store(dst + (2 * kp + 1) * kPanelCols + c, odd);
      }
    }
  }
}

// dst [rows][128] F32 from BF16 rows of x (row stride ld), zero past kw.
void widen_x(const uint16_t* x, int64_t ld, int64_t rows, int64_t kw, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    Vec::widen(x + r * ld, dst + r * kBlockK, kw);
    std::memset(dst + r * kBlockK + kw, 0, size_t(kBlockK - kw) * 4);
  }
}

// Copies the last, partial K block [k0, k) of `rows` F32 rows into dst [rows][128], zero-padded
// (the packed weights are zero there, and X past K must not be read).
void pad_tail(const float* x, int64_t ldx, int64_t rows, int64_t k0, int64_t k, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memset(dst + r * kBlockK, 0, kBlockK * 4);
    std::memcpy(dst + r * kBlockK, x + r * ldx + k0, size_t(k - k0) * 4);
  }
}

// One K block of R rows (x [R][128], row stride ld) against the tile, every slice of the panel:
// W read from the F32 tile wf, or (kFromFp8) converted in registers from the FP8 tile src, the
// same values in the same order. tot [R][64]: the block's sums times scale * kWScale, stored
// (first) or added. Not inlined, so the caller's values do not crowd the register file.
template <int R, bool kFromFp8>
__attribute__((noinline)) void micro(const float* x, int64_t ld, const uint8_t* src,
                                     const float* wf, float scale, float* tot, bool first) {
  using T = typename Vec::T;
  const T s = Vec::set1(scale * kWScale);
  for (int j = 0; j < kSlices; ++j) {
    T acc[R][kSliceVecs];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kSliceVecs; ++v) acc[r][v] = Vec::zero();
    for (int64_t g = 0; g < kBlockK / kGroup; ++g) {  // k = kGroup g .. kGroup g + kGroup - 1
      const int64_t at = g * kPanelCols * kGroup + j * kSliceLen;
      T w[kSliceVecs];
      for (int v = 0; v < kSliceVecs; ++v) {
        if constexpr (kFromFp8) {
          w[v] = Vec::fp8_pairs(src + at + v * kL);
        } else {
          w[v] = Vec::load(wf + at + v * kL);
        }
      }
      for (int r = 0; r < R; ++r) {
        const float* xk = x + r * ld + kGroup * g;
        const T xb = Form::kPairs ? Vec::bcast_pair(xk) : Vec::bcast(xk);
        for (int v = 0; v < kSliceVecs; ++v) acc[r][v] = Vec::fmadd(w[v], xb, acc[r][v]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int o = 0; o < kSliceVecs / kGroup; ++o) {  // kL columns each
        T sum;
        if constexpr (Form::kPairs) {
          sum = Vec::add_pairs(acc[r][2 * o], acc[r][2 * o + 1]);
        } else {
          sum = acc[r][o];
        }
        float* d = tot + r * kPanelCols + j * (kSliceLen / kGroup) + o * kL;
        Vec::store(d, first ? Vec::mul(sum, s) : Vec::fmadd(sum, s, Vec::load(d)));
      }
    }
  }
}

template <bool kFromFp8, int R = kRows>
void micro_rows(int rows, const float* x, int64_t ld, const uint8_t* src, const float* wf,
                float scale, float* tot, bool first) {
  if constexpr (R > 1) {
    if (rows < R) return micro_rows<kFromFp8, R - 1>(rows, x, ld, src, wf, scale, tot, first);
  }
  micro<R, kFromFp8>(x, ld, src, wf, scale, tot, first);
}

// Columns [col0, min(col0 + 64, n)) of row `row` of Y from t [64], F32 or BF16 (to nearest even).
void store_row(const float* t, const GemmJob& job, int64_t row, int64_t col0) {
  const int64_t cols = job.n - col0 < kPanelCols ? job.n - col0 : kPanelCols;
  const int64_t off = row * job.ldy + col0;
  for (int64_t c = 0; c < cols; c += kL) {
    const typename Vec::T v = Vec::load(t + c);
    if (job.y_bf16) {
      uint16_t* y = static_cast<uint16_t*>(job.y) + off + c;
      if (cols - c >= kL) {
        Vec::storeu_bf16(y, v);
      } else {
        Vec::storeu_bf16_n(y, v, cols - c);
      }
    } else {
      float* y = static_cast<float*>(job.y) + off + c;
      if (cols - c >= kL) {
        Vec::storeu(y, v);
      } else {
        Vec::storeu_n(y, v, cols - c);
      }
    }
  }
}

struct Scratch {
  void* p = nullptr;
  explicit Scratch(size_t bytes) : p(std::aligned_alloc(64, (bytes + 63) / 64 * 64)) {}
  ~Scratch() { std::free(p); }
  float* f() const { return static_cast<float*>(p); }
};

void panels_fma(const GemmJob& job, int64_t p0, int64_t p1) {
  // Rows per block: X's block (mb rows x k, 2 or 4 bytes each) stays in L3 while every panel
  // passes over it.
  const int64_t x_bytes = Form::kBf16X ? 2 : 4, mb_min = Form::kBf16X ? 96 : 48;
  int64_t mb_max = (12 << 20) / (x_bytes * job.k);
  mb_max = mb_max < mb_min ? mb_min : mb_max > 1024 ? 1024 : mb_max;
  const int64_t mb_cap = job.m < mb_max ? job.m : mb_max;
  // xbuf: a register block's rows of X widened (BF16 X), or a row block's last K block padded.
  Scratch tile_buf(kBlockK * kPanelCols * 4), tot_buf(size_t(mb_cap) * kPanelCols * 4),
      xbuf(size_t(Form::kBf16X ? kRows : mb_cap) * kBlockK * 4);
  float* wf = tile_buf.f();
  float* tot = tot_buf.f();
  const int64_t k_tail = job.k % kBlockK;  // width of a partial last K block, or 0
  for (int64_t m0 = 0; m0 < job.m; m0 += mb_cap) {
    const int64_t mb = job.m - m0 < mb_cap ? job.m - m0 : mb_cap;
    if constexpr (!Form::kBf16X) {
      if (k_tail) pad_tail(job.xf + m0 * job.ldx, job.ldx, mb, job.k - k_tail, job.k, xbuf.f());
    }
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t kb = 0; kb < job.k_blocks; ++kb) {
        const int64_t kw = job.k - kb * kBlockK < kBlockK ? job.k - kb * kBlockK : kBlockK;
        // F32 X: the row block at this K block, row stride ld (the padded copy for a partial
        // block). BF16 X: xbuf, each register block's rows widened into it below.
        const float* x = xbuf.f();
        int64_t ld = kBlockK;
        if constexpr (!Form::kBf16X) {
          if (kw == kBlockK) x = job.xf + m0 * job.ldx + kb * kBlockK, ld = job.ldx;
        }
        float scale;
        if (job.bf16_tiles) {  // PackedBf16Weight: no scales, converted whatever M is
          convert_tile_bf16(
              reinterpret_cast<const uint16_t*>(job.tiles) + (p * job.k_blocks + kb) * kTileBytes,
              wf);
          scale = 1.0f / kWScale;
        } else {
          const uint8_t* src = job.tiles + (p * job.k_blocks + kb) * kTileBytes;
          scale = job.scales[(p / 2) * job.k_blocks + kb];
          if constexpr (Form::kConvRows > 0) {  // few rows: convert in registers
            if (mb <= Form::kConvRows) {
              micro_rows<true>(int(mb), x, ld, src, nullptr, scale, tot, kb == 0);
              continue;
            }
          }
          convert_tile(src, wf);  // its cost is shared by all rows
        }
        for (int64_t i = 0; i < mb; i += kRows) {
          const int rows = mb - i < kRows ? int(mb - i) : kRows;
          if constexpr (Form::kBf16X) {
            widen_x(job.x + (m0 + i) * job.ldx + kb * kBlockK, job.ldx, rows, kw, xbuf.f());
          } else {
            // The next register block's rows of X come from L3: ask for them early.
            for (int64_t r = i + kRows; r < i + 2 * kRows && r < mb; ++r)
              for (int64_t l = 0; l < kBlockK * 4; l += 64)
                _mm_prefetch(reinterpret_cast<const char*>(x + r * ld) + l, _MM_HINT_T0);
          }
          const float* xr = Form::kBf16X ? x : x + i * ld;
          micro_rows<false>(rows, xr, ld, nullptr, wf, scale, tot + i * kPanelCols, kb == 0);
        }
      }
      for (int64_t i = 0; i < mb; ++i) {
        store_row(tot + i * kPanelCols, job, m0 + i, p * kPanelCols);
      }
    }
  }
}
