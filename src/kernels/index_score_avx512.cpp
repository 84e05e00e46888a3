// index_scores_fp8 on AVX-512 BF16 dot products (kernels/index_score.h).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/index_score.h"

namespace moeserve::index_score_detail {
namespace {

constexpr int64_t kPairs = kIndexKeyDim / 2;  // BF16 pairs per key: one 32-bit lane each
constexpr int kKeys = 4;                      // keys scored together (their queries loaded once)

// BF16 bits of the e4m3 values with a zero exponent field (zero and the subnormals m * 2^-9).
alignas(64) const uint16_t kSubnormalBf16[32] = {0,      0x3B00, 0x3B80, 0x3BC0,
                                                 0x3C00, 0x3C20, 0x3C40, 0x3C60};

// 32 e4m3 bytes as 32 BF16 values (exact: BF16 has e4m3's range and more mantissa).
__m512i e4m3_to_bf16(const uint8_t* src) {
  const __m512i x = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  const __m512i em = _mm512_and_si512(x, _mm512_set1_epi16(0x7f));
  // Normal: the exponent rebased from 7 to 127, the 3 mantissa bits atop BF16's 7.
  const __m512i normal = _mm512_add_epi16(_mm512_slli_epi16(em, 4), _mm512_set1_epi16(0x3C00));
  const __m512i sub = _mm512_permutexvar_epi16(em, _mm512_load_si512(kSubnormalBf16));
  const __mmask32 small = _mm512_cmplt_epu16_mask(em, _mm512_set1_epi16(8));
  const __m512i mag = _mm512_mask_blend_epi16(small, normal, sub);
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(x, _mm512_set1_epi16(0x80)), 8);
  return _mm512_or_si512(mag, sign);
}

void key_to_bf16(const uint8_t* key, uint16_t* out) {
  for (int64_t i = 0; i < kIndexKeyDim; i += 32) {
    _mm512_storeu_si512(out + i, e4m3_to_bf16(key + i));
  }
}

// Adds sum_h w[h] * ReLU(q[h] . k_j) over G groups of 16 heads to tot[j], for kKeys keys:
// qp [kPairs][heads] (a row's query pairs, heads across lanes, from head `h0`), kp[j] the keys'
// BF16 values as pairs, wv the G groups' weights.
template <int G>
void score_heads(const uint32_t* qp, int64_t heads, int64_t h0, const uint32_t* const* kp,
                 const __m512* wv, __m512* tot) {
  __m512 acc[kKeys][G];
  for (int j = 0; j < kKeys; ++j) {
    for (int g = 0; g < G; ++g) acc[j][g] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < kPairs; ++p) {
    __m512bh q[G];
    for (int g = 0; g < G; ++g) q[g] = (__m512bh)_mm512_loadu_si512(qp + p * heads + h0 + 16 * g);
    for (int j = 0; j < kKeys; ++j) {
      const __m512bh k = (__m512bh)_mm512_set1_epi32(int(kp[j][p]));
      for (int g = 0; g < G; ++g) acc[j][g] = _mm512_dpbf16_ps(acc[j][g], q[g], k);
    }
  }
  const __m512 zero = _mm512_setzero_ps();
  for (int j = 0; j < kKeys; ++j) {
    for (int g = 0; g < G; ++g)
      tot[j] = _mm512_fmadd_ps(wv[g], _mm512_max_ps(acc[j][g], zero), tot[j]);
  }
}

}  // namespace

void index_scores_avx512(const uint8_t* q8, const float* w, int64_t rows, int64_t heads,
                         const IndexKeys& keys, int64_t key_begin, int64_t key_end, float* scores,
                         int64_t ld) {
  // Every row's query as pairs with the heads across the lanes: [rows][kPairs][heads].
  std::vector<uint32_t> qp(size_t(rows * kPairs * heads));
  {
    alignas(64) uint16_t q16[kIndexKeyDim];
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        key_to_bf16(q8 + (r * heads + h) * kIndexKeyDim, q16);
        uint32_t* dst = &qp[size_t(r * kPairs * heads + h)];
        for (int64_t p = 0; p < kPairs; ++p) std::memcpy(dst + p * heads, q16 + 2 * p, 4);
      }
    }
  }
  // A block of keys at a time, widened once for all the rows; the last group padded with zeros.
  alignas(64) uint32_t kb[kIndexKeyBlock][kPairs];
  float ks[kIndexKeyBlock];
  for (int64_t s0 = key_begin; s0 < key_end;) {
    const int64_t b = s0 / kIndexKeyBlock;
    const int64_t s1 = std::min(key_end, (b + 1) * kIndexKeyBlock);
    const int64_t n = s1 - s0;
    const int64_t padded = (n + kKeys - 1) / kKeys * kKeys;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* key =
          keys.blocks[size_t(b)] + (s0 - b * kIndexKeyBlock + i) * kIndexKeyEntryBytes;
      key_to_bf16(key, reinterpret_cast<uint16_t*>(kb[i]));
      std::memcpy(&ks[i], key + kIndexKeyDim, sizeof(float));
    }
    for (int64_t i = n; i < padded; ++i) {
      std::memset(kb[i], 0, sizeof kb[i]);
      ks[i] = 0;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const uint32_t* q = &qp[size_t(r * kPairs * heads)];
      const float* wr = w + r * heads;
      float* out = scores + r * ld + (s0 - key_begin);
      for (int64_t i = 0; i < padded; i += kKeys) {
        const uint32_t* kp[kKeys] = {kb[i], kb[i + 1], kb[i + 2], kb[i + 3]};
        __m512 tot[kKeys] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                             _mm512_setzero_ps()};
        for (int64_t h0 = 0; h0 < heads; h0 += 64) {  // up to 4 groups of 16 heads at once
          __m512 wv[4];
          const int groups = int(std::min<int64_t>(4, (heads - h0) / 16));
          for (int g = 0; g < groups; ++g) wv[g] = _mm512_loadu_ps(wr + h0 + 16 * g);
          switch (groups) {
            case 4:
              score_heads<4>(q, heads, h0, kp, wv, tot);
              break;
            case 3:
              score_heads<3>(q, heads, h0, kp, wv, tot);
              break;
            case 2:
              score_heads<2>(q, heads, h0, kp, wv, tot);
              break;
            default:
              score_heads<1>(q, heads, h0, kp, wv, tot);
          }
        }
        for (int j = 0; j < kKeys && i + j < n; ++j) {
          out[i + j] = ks[i + j] * _mm512_reduce_add_ps(tot[j]);
        }
      }
    }
    s0 = s1;
  }
}

}  // namespace moeserve::index_score_detail
