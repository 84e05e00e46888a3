// DeepSeek-V4's lightning indexer in FP4 (docs/deepseek-v4.md "Index keys in FP4"): DeepSeek's
// model.py rotates the indexer's queries and compressed keys by a Hadamard matrix and rounds both
// to FP4 e2m1 with one power-of-two (UE8M0) scale per 32 values (its fp4_act_quant; the model was
// trained that way), so a key is kept as d/2 bytes of e2m1 codes and d/32 exponent bytes: 68 bytes
// for V4's 128-value keys, against 512 in F32. The score of a key k for a query of H heads:
//
//   I(k) = sum_h w[h] * ReLU(sum_b sq[h][b] * sk[b] * (q[h]_b . k_b))     b: the d/32 blocks
//
// Each block's dot product is exact in integers: twice an e2m1 value is an integer in [-12, 12].
// Levels: the scalar reference (the integer dot products, each block's term and each head's
// summed in order in F32) and, on Isa::kAvx512Bf16 and above when H is a multiple of 16, AVX-512
// VNNI (the keys as unsigned bytes 2k + 12, the queries' 12 * sum(2q) taken off up front; the
// heads across the vector lanes, a key broadcast four values at a time, so a key is read once for
// every head). The blocks' terms are the same F32 values in both (an integer times a power of
// two); only the order of the sum over the heads differs (a few ulp of the score).
// Pure functions: any thread may call them.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu_features.h"

namespace moeserve {

inline constexpr int64_t kFp4Block = 32;  // values per scale

// Bytes of one d-value key: d/2 bytes of codes (value 2j in the low nibble of byte j), then d/32
// exponent bytes (scale 2^(e - 127)).
constexpr int64_t fp4_index_key_bytes(int64_t d) {
  return d / 2 + d / kFp4Block;
}

// x[0, d) (d a multiple of 32) as model.py's fp4_act_quant rounds it: per block of 32, scale
// 2^ceil(log2(max(amax, 6 * 2^-126) / 6)), each value x / scale clamped to [-6, 6] and rounded to
// the nearest e2m1 value (ties to even); written as fp4_index_key_bytes(d) bytes.
void fp4_index_quantize(const float* x, int64_t d, uint8_t* out);
// The values a quantized vector stands for.
void fp4_index_dequantize(const uint8_t* in, int64_t d, float* out);

// One query of `heads` heads of d values (each already rotated), quantized as the keys are and
// laid out for the kernels; w[h] the heads' weights (every factor but the scales included).
struct Fp4IndexQuery {
  int64_t heads = 0, d = 0;
  std::vector<int8_t> q2;     // [d/4][heads][4]: twice the e2m1 values
  std::vector<int32_t> corr;  // [d/32][heads]: -12 * the block's sum of q2
  std::vector<float> scale;   // [d/32][heads]: the block's scale / 4
  std::vector<float> w;       // [heads]
};
void fp4_index_query(const float* q, const float* w, int64_t heads, int64_t d, Fp4IndexQuery& out);

// out[j] = I(key j) for the n keys at keys + j * ld (fp4_index_key_bytes(d) bytes each).
void fp4_index_scores(const Fp4IndexQuery& q, const uint8_t* keys, int64_t n, int64_t ld,
                      float* out, Isa isa = active_isa());

namespace index_fp4_detail {
void fp4_index_scores_avx512(const Fp4IndexQuery& q, const uint8_t* keys, int64_t n, int64_t ld,
                             float* out);
}  // namespace index_fp4_detail

}  // namespace moeserve
