// SwiGLU's activation: out = silu(g) * u = g / (1 + exp(-g)) * u, elementwise, F32 in, F32 or
// BF16 out (BF16: f32_to_bf16 of the F32 result, round to nearest even, NaN quieted).
//
// The *_ref functions are the reference path's (std::exp: the expression the model always
// used). silu_mul and silu_mul_bf16 are the fast path's: the same division and multiply around
// a vectorized exp (range reduction by ln 2, a degree-6 polynomial, within ~1 ulp of std::exp
// on the range that matters), so results are within a few ulp of the reference. Non-finite and
// extreme inputs behave as the reference: g -> -large gives -0/+0 (exp(-g) overflows to inf),
// g = +inf gives inf * u, g = -inf gives NaN (-inf / inf, as in PyTorch), NaN stays NaN.
// Elementwise, so a value never depends on n or on how a caller splits the range; the AVX2 and
// AVX-512 levels give the same bits; the scalar level is the reference. out may be g or u
// (exactly, the same pointer) for the F32 output. Pure functions: any thread may call them.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"

namespace moeserve {

// g, u, out: [n].
void silu_mul_ref(const float* g, const float* u, int64_t n, float* out);
void silu_mul_bf16_ref(const float* g, const float* u, int64_t n, uint16_t* out);

void silu_mul(const float* g, const float* u, int64_t n, float* out, Isa isa = active_isa());
void silu_mul_bf16(const float* g, const float* u, int64_t n, uint16_t* out,
                   Isa isa = active_isa());

namespace silu_mul_detail {
void silu_mul_avx512(const float* g, const float* u, int64_t n, float* out);
void silu_mul_bf16_avx512(const float* g, const float* u, int64_t n, uint16_t* out);
void silu_mul_avx2(const float* g, const float* u, int64_t n, float* out);
void silu_mul_bf16_avx2(const float* g, const float* u, int64_t n, uint16_t* out);
}  // namespace silu_mul_detail

}  // namespace moeserve
