// gemm_fp8, AVX-512F level (no BF16 dot products): each 64x128 FP8 tile is converted once to an
// F32 tile [128 k][64 cols] (32 KB), X to F32 per 6-row block, and a 6-row x 4-zmm register block
// runs FP32 FMAs. The block scale multiplies each 128-wide K partial sum once, as in all levels.
// Compiled with -mavx512{f,bw,vl,dq}; runs only when cpu_isa() >= Isa::kAvx512.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/gemm_fp8_internal.h"

namespace moeserve::gemm_detail {
namespace {

constexpr int kRows = 6;

// FP8 byte at bits 24..31 of each lane -> F32: sign | magnitude << 20 is the value times
// 2^-120 (subnormals become F32 subnormals), and the multiply by 2^120 is exact.
inline __m512 fp8_hi_to_f32(__m512i s) {
  __m512i bits = _mm512_and_si512(_mm512_srai_epi32(s, 4), _mm512_set1_epi32(int(0x87f00000u)));
  return _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
}

// Tile [64 kp][64 cols][2] FP8 -> dst [128 k][64 cols] F32.
void convert_tile(const uint8_t* src, float* dst) {
  for (int kp = 0; kp < 64; ++kp) {
    for (int g = 0; g < 4; ++g) {
      __m512i v = _mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + kp * 128 + 32 * g)));
      _mm512_store_ps(dst + (2 * kp) * 64 + 16 * g, fp8_hi_to_f32(_mm512_slli_epi32(v, 24)));
      _mm512_store_ps(dst + (2 * kp + 1) * 64 + 16 * g, fp8_hi_to_f32(_mm512_slli_epi32(v, 16)));
    }
  }
}

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

// xf [R][128] F32 from BF16 rows x (row stride ld), zero past kw.
void convert_x(const uint16_t* x, int64_t ld, int rows, int64_t kw, float* xf) {
  for (int r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < kBlockK; k += 16) {
      __m512i v = _mm512_setzero_si512();
      if (k < kw) {
        __mmask16 m = kw - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (kw - k)) - 1);
        v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + r * ld + k));
      }
      _mm512_store_ps(xf + r * kBlockK + k, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
  }
}

template <int R>
void micro(const float* xf, const float* wf, float scale, float* tot, bool first) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int k = 0; k < kBlockK; ++k) {
    const float* w = wf + k * 64;
    __m512 w0 = _mm512_load_ps(w), w1 = _mm512_load_ps(w + 16), w2 = _mm512_load_ps(w + 32),
           w3 = _mm512_load_ps(w + 48);
    for (int r = 0; r < R; ++r) {
      __m512 xb = _mm512_set1_ps(xf[r * kBlockK + k]);
      acc[r][0] = _mm512_fmadd_ps(w0, xb, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(w1, xb, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(w2, xb, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(w3, xb, acc[r][3]);
    }
  }
  __m512 s = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < 4; ++j) {
      float* d = tot + r * kPanelCols + 16 * j;
      _mm512_store_ps(d, first ? _mm512_mul_ps(acc[r][j], s)
                               : _mm512_fmadd_ps(acc[r][j], s, _mm512_load_ps(d)));
    }
  }
}

void micro_rows(int rows, const float* xf, const float* wf, float scale, float* tot, bool first) {
  switch (rows) {
    case 6:
      return micro<6>(xf, wf, scale, tot, first);
    case 5:
      return micro<5>(xf, wf, scale, tot, first);
    case 4:
      return micro<4>(xf, wf, scale, tot, first);
    case 3:
      return micro<3>(xf, wf, scale, tot, first);
    case 2:
      return micro<2>(xf, wf, scale, tot, first);
    default:
      return micro<1>(xf, wf, scale, tot, first);
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

void panels_avx512(const GemmJob& job, int64_t p0, int64_t p1) {
  int64_t mb_max = (12 << 20) / (2 * job.k);
  mb_max = mb_max < 96 ? 96 : mb_max > 1024 ? 1024 : mb_max;
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
        convert_tile(job.tiles + (p * job.k_blocks + kb) * kTileBytes, wf);
        const float scale = job.scales[(p / 2) * job.k_blocks + kb];
        const int64_t kw = job.k - kb * kBlockK < kBlockK ? job.k - kb * kBlockK : kBlockK;
        for (int64_t i = 0; i < mb; i += kRows) {
          int rows = mb - i < kRows ? int(mb - i) : kRows;
          convert_x(job.x + (m0 + i) * job.ldx + kb * kBlockK, job.ldx, rows, kw, xf);
          micro_rows(rows, xf, wf, scale, tot + i * kPanelCols, kb == 0);
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
