// gemm_fp8_f32x, AVX2+FMA level: each 64x128 FP8 tile is converted once to an F32 tile
// [128 k][64 cols] (exact, as the AVX-512F level), then a 4-row x 2-ymm register block walks the
// panel's four 16-column slices with FP32 FMAs; the block scale multiplies each 128-wide K
// partial sum once. Compiled with -mavx2 -mfma; runs only when cpu_isa() >= Isa::kAvx2.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/gemm_fp8_internal.h"

namespace moeserve::gemm_detail {
namespace {

constexpr int kRows = 4;

// Tile [64 kp][64 cols][2] FP8 -> dst [128 k][64 cols] F32. 16 bytes (8 columns x 2 k)
// sign-extended to words: see fp8x32_to_f32 in the AVX-512F level for the bit arithmetic.
void convert_tile(const uint8_t* src, float* dst) {
  const __m256i mask = _mm256_set1_epi32(int(0x87f00000u));
  const __m256 two120 = _mm256_set1_ps(0x1p120f);
  for (int kp = 0; kp < 64; ++kp) {
    for (int g = 0; g < 8; ++g) {
      __m256i w = _mm256_cvtepi8_epi16(
          _mm_load_si128(reinterpret_cast<const __m128i*>(src + kp * 128 + 16 * g)));
      __m256 lo = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(w, 20), mask));
      __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(w, 4), mask));
      _mm256_store_ps(dst + (2 * kp) * 64 + 8 * g, _mm256_mul_ps(lo, two120));
      _mm256_store_ps(dst + (2 * kp + 1) * 64 + 8 * g, _mm256_mul_ps(hi, two120));
    }
  }
}

// The same for a BF16 tile (PackedBf16Weight): each 32-bit pair (k even low, k odd high) of 8
// columns gives both F32 rows exactly.
void convert_tile_bf16(const uint16_t* src, float* dst) {
  const __m256i high = _mm256_set1_epi32(int(0xffff0000u));
  for (int kp = 0; kp < 64; ++kp) {
    for (int g = 0; g < 8; ++g) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + kp * 128 + 16 * g));
      _mm256_store_ps(dst + (2 * kp) * 64 + 8 * g, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
      _mm256_store_ps(dst + (2 * kp + 1) * 64 + 8 * g, _mm256_castsi256_ps(_mm256_and_si256(v, high)));
    }
  }
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// xf [rows][128] from rows of x (row stride ld), zero past kw (X past K must not be read).
void copy_x(const float* x, int64_t ld, int rows, int64_t kw, float* xf) {
  for (int r = 0; r < rows; ++r) {
    std::memcpy(xf + r * kBlockK, x + r * ld, size_t(kw) * 4);
    std::memset(xf + r * kBlockK + kw, 0, size_t(kBlockK - kw) * 4);
  }
}

// Rows x 16 columns (slice j of the panel) over one K block; x [R] rows with stride ld.
template <int R>
void micro(const float* x, int64_t ld, const float* wf, int j, float scale, float* tot,
           bool first) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int k = 0; k < kBlockK; ++k) {
    const float* w = wf + k * 64 + 16 * j;
    __m256 w0 = _mm256_load_ps(w), w1 = _mm256_load_ps(w + 8);
    for (int r = 0; r < R; ++r) {
      __m256 xb = _mm256_broadcast_ss(x + r * ld + k);
      acc[r][0] = _mm256_fmadd_ps(w0, xb, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w1, xb, acc[r][1]);
    }
  }
  __m256 s = _mm256_set1_ps(scale);
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < 2; ++h) {
      float* d = tot + r * kPanelCols + 16 * j + 8 * h;
      _mm256_store_ps(d, first ? _mm256_mul_ps(acc[r][h], s)
                               : _mm256_fmadd_ps(acc[r][h], s, _mm256_load_ps(d)));
    }
  }
}

void micro_rows(int rows, const float* x, int64_t ld, const float* wf, int j, float scale,
                float* tot, bool first) {
  switch (rows) {
    case 4:
      return micro<4>(x, ld, wf, j, scale, tot, first);
    case 3:
      return micro<3>(x, ld, wf, j, scale, tot, first);
    case 2:
      return micro<2>(x, ld, wf, j, scale, tot, first);
    default:
      return micro<1>(x, ld, wf, j, scale, tot, first);
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

void panels_f32x_avx2(const GemmJob& job, int64_t p0, int64_t p1) {
  int64_t mb_max = (12 << 20) / (4 * job.k);
  mb_max = mb_max < 48 ? 48 : mb_max > 1024 ? 1024 : mb_max;
  const int64_t mb_cap = job.m < mb_max ? job.m : mb_max;
  Scratch wf_buf(kBlockK * kPanelCols * 4), xf_buf(kRows * kBlockK * 4),
      tot_buf(size_t(mb_cap) * kPanelCols * 4);
  float* wf = wf_buf.as<float>();
  float* xf = xf_buf.as<float>();
  float* tot = tot_buf.as<float>();
  for (int64_t m0 = 0; m0 < job.m; m0 += mb_cap) {
    const int64_t mb = job.m - m0 < mb_cap ? job.m - m0 : mb_cap;
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t kb = 0; kb < job.k_blocks; ++kb) {
        float scale = 1.0f;  // BF16 tiles (PackedBf16Weight) have none
        if (job.bf16_tiles) {
          convert_tile_bf16(reinterpret_cast<const uint16_t*>(job.tiles) +
                                (p * job.k_blocks + kb) * kTileBytes,
                            wf);
        } else {
          convert_tile(job.tiles + (p * job.k_blocks + kb) * kTileBytes, wf);
          scale = job.scales[(p / 2) * job.k_blocks + kb];
        }
        const int64_t kw = job.k - kb * kBlockK < kBlockK ? job.k - kb * kBlockK : kBlockK;
        for (int64_t i = 0; i < mb; i += kRows) {
          int rows = mb - i < kRows ? int(mb - i) : kRows;
          const float* x = job.xf + (m0 + i) * job.ldx + kb * kBlockK;
          int64_t ld = job.ldx;
          if (kw < kBlockK) {  // last, partial K block: a zero-padded copy
            copy_x(x, job.ldx, rows, kw, xf);
            x = xf, ld = kBlockK;
          }
          for (int j = 0; j < 4; ++j)
            micro_rows(rows, x, ld, wf, j, scale, tot + i * kPanelCols, kb == 0);
        }
      }
      const int64_t col0 = p * kPanelCols;
      const int64_t cols = job.n - col0 < kPanelCols ? job.n - col0 : kPanelCols;
      for (int64_t i = 0; i < mb; ++i) {
        const float* t = tot + i * kPanelCols;
        int64_t off = (m0 + i) * job.ldy + col0;
        if (job.y_bf16) {
          uint16_t* y = static_cast<uint16_t*>(job.y) + off;
          for (int64_t c = 0; c < cols; ++c) y[c] = to_bf16(t[c]);
        } else {
          std::memcpy(static_cast<float*>(job.y) + off, t, size_t(cols) * 4);
        }
      }
    }
  }
}

}  // namespace moeserve::gemm_detail
