// The lightning indexer of DeepSeek Sparse Attention (DeepSeek-V3.2; docs/dsa.md), in the
// arithmetic of DeepSeek's inference/model.py (the 2025-11-17 form: the indexer's RoPE is
// non-interleaved): FP32 values, with DeepSeek's two roundings that decide which tokens are
// picked, a 128-point Hadamard rotation and FP8 e4m3 with one power-of-two (ue8m0) scale per
// 128-value vector.
//
// Per query token t and cached token s of one layer:
//   q[t,h] = FP8(Hadamard(RoPE_half(wq_b(q_latent_t)[h])))      h < index_n_heads, 128 dims
//   k[s]   = FP8(Hadamard(RoPE_half(LayerNorm(wk(x_s)))))         one key shared by the heads
//   w[t,h] = weights_proj(x_t)[h] * n_heads^-1/2 * q_scale[t,h] * 128^-1/2
//   I[t,s] = k_scale[s] * sum_h w[t,h] * ReLU(q_fp8[t,h] . k_fp8[s])
// and the query attends to the top_k cached positions by I (all of them when there are no more
// than top_k). index_score_f32 is transformers' deepseek_v32 form: neither rotation nor FP8.
//
// Pure functions of their arguments: any thread may call them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/index_score.h"

namespace moeserve {

// x[0, n) = H_n x / sqrt(n) in place (Sylvester's Walsh-Hadamard matrix; n a power of two).
void hadamard_rotate(float* x, int64_t n);

// DeepSeek's act_quant of one 128-value block with scale_fmt ue8m0: s = 2^ceil(log2(amax / 448))
// with amax = max(|x|, 1e-4), q = e4m3(x / s) (saturating, nearest even). Returns s.
float quantize_index_fp8(const float* x, uint8_t* q);

// RoPE on x[0, dim) in the non-interleaved (rotate-half) layout: pairs (x[i], x[i + dim/2]) turn
// by pos * inv_freq[i], cos and sin times attention_factor (as kernels/rope.h's table).
void rope_half(float* x, int64_t dim, std::span<const float> inv_freq, float attention_factor,
               int64_t pos);

// LayerNorm of x[0, n) in place: (x - mean) / sqrt(var + eps) * w + b.
void layer_norm(float* x, int64_t n, const float* w, const float* b, float eps);

// I[t, s] of one query and one key (the FP8 arithmetic): kernels/index_score.h's index_score,
// with its SIMD levels over many keys (index_scores_fp8).

// The same without FP8 or Hadamard, as transformers' deepseek_v32: q [n_heads][128] F32,
// I = sum_h w[h] * ReLU((q[h] . key) * scale).
float index_score_f32(const float* q, const float* w, int64_t n_heads, const float* key,
                      float scale);

// top_k_positions and the FP8 scores' top-k over many rows (index_topk): kernels/index_score.h.

}  // namespace moeserve
