#include "kernels/index_fp4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/index_fp4_internal.h"

namespace moeserve {

namespace {

// The e2m1 code (sign in bit 3) nearest y (|y| <= 6), ties to the even code, as a float cast.
uint8_t e2m1_code(float y) {
  const float a = std::fabs(y);
  const uint8_t c = a <= 0.25f   ? 0
                    : a < 0.75f  ? 1
                    : a <= 1.25f ? 2
                    : a < 1.75f  ? 3
                    : a <= 2.5f  ? 4
                    : a < 3.5f   ? 5
                    : a <= 5.0f  ? 6
                                 : 7;
  return uint8_t(c | (std::signbit(y) ? 8 : 0));
}

// The block's exponent byte: ceil(log2(max(amax, 6 * 2^-126) / 6)) + 127, as model.py's
// power-of-two rounding of the scale (exponent plus one where any mantissa bit is set).
uint8_t block_exponent(const float* x) {
  float amax = 6.0f * std::ldexp(1.0f, -126);
  for (int64_t i = 0; i < kFp4Block; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float v = amax * (1.0f / 6.0f);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  uint32_t e = (bits >> 23) & 0xff;
  if (bits & 0x7fffff) ++e;
  return uint8_t(std::min<uint32_t>(e, 254));
}

}  // namespace

void fp4_index_quantize(const float* x, int64_t d, uint8_t* out) {
  CHECK(d % kFp4Block == 0, "an FP4 index vector is a whole number of 32-value blocks");
  uint8_t* codes = out;
  uint8_t* exps = out + d / 2;
  for (int64_t b = 0; b < d / kFp4Block; ++b) {
    const float* xb = x + b * kFp4Block;
    const uint8_t e = block_exponent(xb);
    exps[b] = e;
    const float s = f8e8m0_to_f32(e);
    for (int64_t i = 0; i < kFp4Block; i += 2) {
      const uint8_t lo = e2m1_code(std::clamp(xb[i] / s, -6.0f, 6.0f));
      const uint8_t hi = e2m1_code(std::clamp(xb[i + 1] / s, -6.0f, 6.0f));
      codes[(b * kFp4Block + i) / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

void fp4_index_dequantize(const uint8_t* in, int64_t d, float* out) {
  for (int64_t i = 0; i < d; ++i) {
    out[i] = fp4e2m1_to_f32(uint8_t(in[i / 2] >> (4 * (i & 1)))) *
             f8e8m0_to_f32(in[d / 2 + i / kFp4Block]);
  }
}

void fp4_index_query(const float* q, const float* w, int64_t heads, int64_t d, Fp4IndexQuery& out) {
  CHECK(d % kFp4Block == 0, "an FP4 index query is a whole number of 32-value blocks");
  const int64_t nb = d / kFp4Block;
  out.heads = heads;
  out.d = d;
  out.q2.assign(size_t(heads * d), 0);
  out.corr.assign(size_t(nb * heads), 0);
  out.scale.assign(size_t(nb * heads), 0.0f);
  out.w.assign(w, w + heads);
  std::vector<uint8_t> packed(size_t(fp4_index_key_bytes(d)));
  for (int64_t h = 0; h < heads; ++h) {
    fp4_index_quantize(q + h * d, d, packed.data());
    for (int64_t i = 0; i < d; ++i) {
      const int8_t v = index_fp4_detail::kE2m1Twice[(packed[size_t(i / 2)] >> (4 * (i & 1))) & 0xf];
      out.q2[size_t(((i / 4) * heads + h) * 4 + i % 4)] = v;
      out.corr[size_t((i / kFp4Block) * heads + h)] -= 12 * v;
    }
    for (int64_t b = 0; b < nb; ++b) {
      out.scale[size_t(b * heads + h)] = f8e8m0_to_f32(packed[size_t(d / 2 + b)]) * 0.25f;
    }
  }
}

void fp4_index_scores(const Fp4IndexQuery& q, const uint8_t* keys, int64_t n, int64_t ld,
                      float* out, Isa isa) {
  if (isa >= Isa::kAvx512Bf16 && q.heads % 16 == 0 && q.d <= index_fp4_detail::kMaxAvx512Dim) {
    return index_fp4_detail::fp4_index_scores_avx512(q, keys, n, ld, out);
  }
  const int64_t H = q.heads, d = q.d, nb = d / kFp4Block;
  std::vector<int32_t> k2(static_cast<size_t>(d));
  std::vector<float> ks(static_cast<size_t>(nb));
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* key = keys + j * ld;
    for (int64_t i = 0; i < d; ++i) {
      k2[size_t(i)] = index_fp4_detail::kE2m1Twice[(key[i / 2] >> (4 * (i & 1))) & 0xf];
    }
    for (int64_t b = 0; b < nb; ++b) ks[size_t(b)] = f8e8m0_to_f32(key[d / 2 + b]);
    float sum = 0;
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t dot = 0;
        for (int64_t i = b * kFp4Block; i < (b + 1) * kFp4Block; ++i) {
          dot += int32_t(q.q2[size_t(((i / 4) * H + h) * 4 + i % 4)]) * k2[size_t(i)];
        }
        acc += float(dot) * (q.scale[size_t(b * H + h)] * ks[size_t(b)]);
      }
      sum += q.w[size_t(h)] * std::max(acc, 0.0f);
    }
    out[j] = sum;
  }
}

}  // namespace moeserve
