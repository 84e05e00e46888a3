// fp4_index_scores on AVX-512 VNNI (kernels/index_fp4.h).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "kernels/index_fp4.h"
#include "kernels/index_fp4_internal.h"

namespace moeserve::index_fp4_detail {
namespace {

constexpr int kKeys = 2;  // keys scored together (the queries' loads shared)
constexpr int64_t kMaxD = kMaxAvx512Dim;

// A key's codes as unsigned bytes 2k + 12, in value order, into out[0, d).
void unpack_key(const uint8_t* key, int64_t d, uint8_t* out) {
  // Output byte i takes packed byte i / 2, its low nibble at even i and its high one at odd i.
  // And the 16 codes' bytes 2k + 12 in every 128-bit lane (vpshufb's table).
  struct Tables {
    alignas(64) uint8_t idx[64];
    alignas(64) uint8_t lut[64];
  };
  static const Tables kT = [] {
    Tables t{};
    for (int i = 0; i < 64; ++i) {
      t.idx[i] = uint8_t(i / 2);
      t.lut[i] = uint8_t(kE2m1Twice[i % 16] + 12);
    }
    return t;
  }();
  const __m512i idx = _mm512_load_si512(kT.idx);
  const __m512i lut = _mm512_load_si512(kT.lut);
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  for (int64_t i = 0; i < d; i += 64) {
    const int64_t bytes = std::min<int64_t>(32, (d - i) / 2);
    const __m512i x = _mm512_maskz_loadu_epi8((__mmask64(1) << bytes) - 1, key + i / 2);
    const __m512i t = _mm512_permutexvar_epi8(idx, x);
    // The odd bytes' high nibbles down to their low bits (a 16-bit shift moves the odd byte's
    // high nibble into its own low bits).
    const __m512i v = _mm512_and_si512(
        _mm512_mask_blend_epi8(__mmask64(0xAAAAAAAAAAAAAAAAull), t, _mm512_srli_epi16(t, 4)),
        nibble);
    const __m512i u = _mm512_shuffle_epi8(lut, v);
    const int64_t vals = std::min<int64_t>(64, d - i);
    _mm512_mask_storeu_epi8(out + i, vals == 64 ? ~__mmask64(0) : (__mmask64(1) << vals) - 1, u);
  }
}

// tot[j] (heads across lanes) += sum over G groups of 16 heads from h0 of
// w[h] * ReLU(sum_b sq[h][b] sk[j][b] (q[h]_b . k_j,b)), for nk <= kKeys keys.
template <int G>
void score_heads(const Fp4IndexQuery& q, int64_t h0, const uint8_t (*kb)[kMaxD],
                 const float (*ks)[kMaxD / kFp4Block], int nk, __m512* tot) {
  const int64_t H = q.heads, nb = q.d / kFp4Block;
  __m512 part[kKeys][G];
  for (int64_t b = 0; b < nb; ++b) {
    __m512i acc[kKeys][G];
    for (int g = 0; g < G; ++g) {
      const __m512i c = _mm512_loadu_si512(&q.corr[size_t(b * H + h0 + 16 * g)]);
      for (int j = 0; j < kKeys; ++j) acc[j][g] = c;
    }
    for (int64_t g4 = b * 8; g4 < b * 8 + 8; ++g4) {
      __m512i qv[G];
      for (int g = 0; g < G; ++g) {
        qv[g] = _mm512_loadu_si512(&q.q2[size_t((g4 * H + h0 + 16 * g) * 4)]);
      }
      for (int j = 0; j < kKeys; ++j) {
        if (j >= nk) break;
        int32_t k4;
        std::memcpy(&k4, &kb[j][g4 * 4], 4);
        const __m512i kv = _mm512_set1_epi32(k4);
        for (int g = 0; g < G; ++g) acc[j][g] = _mm512_dpbusd_epi32(acc[j][g], kv, qv[g]);
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512 sq = _mm512_loadu_ps(&q.scale[size_t(b * H + h0 + 16 * g)]);
      for (int j = 0; j < kKeys; ++j) {
        if (j >= nk) break;
        // An integer times a power of two: exact, so the sum's rounding is the scalar level's.
        const __m512 s = _mm512_mul_ps(sq, _mm512_set1_ps(ks[j][b]));
        const __m512 f = _mm512_cvtepi32_ps(acc[j][g]);
        part[j][g] = b == 0 ? _mm512_mul_ps(f, s) : _mm512_fmadd_ps(f, s, part[j][g]);
      }
    }
  }
  for (int j = 0; j < nk; ++j) {
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_loadu_ps(&q.w[size_t(h0 + 16 * g)]);
      tot[j] = _mm512_fmadd_ps(w, _mm512_max_ps(part[j][g], _mm512_setzero_ps()), tot[j]);
    }
  }
}

}  // namespace

void fp4_index_scores_avx512(const Fp4IndexQuery& q, const uint8_t* keys, int64_t n, int64_t ld,
                             float* out) {
  const int64_t d = q.d, H = q.heads, nb = d / kFp4Block;
  alignas(64) uint8_t kb[kKeys][kMaxD];
  float ks[kKeys][kMaxD / kFp4Block];
  for (int64_t j0 = 0; j0 < n; j0 += kKeys) {
    const int nk = int(std::min<int64_t>(kKeys, n - j0));
    for (int j = 0; j < nk; ++j) {
      const uint8_t* key = keys + (j0 + j) * ld;
      unpack_key(key, d, kb[j]);
      for (int64_t b = 0; b < nb; ++b) ks[j][b] = f8e8m0_to_f32(key[d / 2 + b]);
    }
    __m512 tot[kKeys];
    for (int j = 0; j < kKeys; ++j) tot[j] = _mm512_setzero_ps();
    int64_t h0 = 0;
    for (; h0 + 64 <= H; h0 += 64) score_heads<4>(q, h0, kb, ks, nk, tot);
    switch ((H - h0) / 16) {
      case 3:
        score_heads<3>(q, h0, kb, ks, nk, tot);
        break;
      case 2:
        score_heads<2>(q, h0, kb, ks, nk, tot);
        break;
      case 1:
        score_heads<1>(q, h0, kb, ks, nk, tot);
        break;
      default:
        break;
    }
    for (int j = 0; j < nk; ++j) out[j0 + j] = _mm512_reduce_add_ps(tot[j]);
  }
}

}  // namespace moeserve::index_fp4_detail
