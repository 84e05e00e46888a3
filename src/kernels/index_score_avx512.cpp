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

// The e4m3 -> BF16 tables (index_score_detail::e4m3_bf16_tables, built by the baseline code:
// no inline code shared with it) in registers, for a call's keys and queries.
struct Widen {
  __m512i lo0, lo1, hi0, hi1;
  Widen() {
    const uint8_t* t = e4m3_bf16_tables();
    lo0 = _mm512_loadu_si512(t);
    lo1 = _mm512_loadu_si512(t + 64);
    hi0 = _mm512_loadu_si512(t + 128);
    hi1 = _mm512_loadu_si512(t + 192);
  }

  // 64 e4m3 bytes as 64 BF16 values (exact), into out[0, 64), in the order of the byte
  // unpacks: within each 16-value lane group, values 0-7 go to the first vector and 8-15 to the
  // second. Queries and keys are widened alike, and the order keeps each value beside its pair
  // partner (2i, 2i + 1), so the dot products sum over the same pairs.
  void to_bf16_64(const uint8_t* src, uint16_t* out) const {
    const __m512i x = _mm512_loadu_si512(src);
    // VBMI: bits 0-6 of each byte pick one of 128 table bytes (bit 7, the sign, is ignored).
    const __m512i lo = _mm512_permutex2var_epi8(lo0, x, lo1);
    __m512i hi = _mm512_permutex2var_epi8(hi0, x, hi1);
    hi = _mm512_or_si512(hi, _mm512_and_si512(x, _mm512_set1_epi8(char(0x80))));  // the sign
    _mm512_storeu_si512(out, _mm512_unpacklo_epi8(lo, hi));
    _mm512_storeu_si512(out + 32, _mm512_unpackhi_epi8(lo, hi));
  }

  void key(const uint8_t* key, uint16_t* out) const {
    to_bf16_64(key, out);
    to_bf16_64(key + 64, out + 64);
  }
};

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
  const Widen widen;
  // Every row's query as pairs with the heads across the lanes: [rows][kPairs][heads].
  std::vector<uint32_t> qp(size_t(rows * kPairs * heads));
  {
    alignas(64) uint16_t q16[kIndexKeyDim];
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        widen.key(q8 + (r * heads + h) * kIndexKeyDim, q16);
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
      widen.key(key, reinterpret_cast<uint16_t*>(kb[i]));
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
