#include "kernels/convert.h"

#include "core/dtype.h"

namespace moeserve {

namespace {
bool use_avx512(Isa isa) {
  return isa >= Isa::kAvx512;
}
}  // namespace

void fp8_1x128_to_f32_row(const uint8_t* q, const float* scales, int64_t n, float* out, Isa isa) {
  if (use_avx512(isa)) return convert_detail::fp8_1x128_to_f32_avx512(q, scales, n, out);
  for (int64_t c = 0; c < n; ++c) out[c] = fp8e4m3_to_f32(q[c]) * scales[c / 128];
}

void bf16_to_f32_row(const uint16_t* x, int64_t n, float* out, Isa isa) {
  if (use_avx512(isa)) return convert_detail::bf16_to_f32_avx512(x, n, out);
  for (int64_t c = 0; c < n; ++c) out[c] = bf16_to_f32(x[c]);
}

void bf16_axpy_row(float w, const uint16_t* x, int64_t n, float* y, Isa isa) {
  if (use_avx512(isa)) return convert_detail::bf16_axpy_avx512(w, x, n, y);
  for (int64_t c = 0; c < n; ++c) {
    const float p = w * bf16_to_f32(x[c]);
    y[c] += p;
  }
}

void f32_to_bf16_row_isa(const float* x, int64_t n, uint16_t* out, Isa isa) {
  if (use_avx512(isa)) return convert_detail::f32_to_bf16_avx512(x, n, out);
  for (int64_t c = 0; c < n; ++c) out[c] = f32_to_bf16(x[c]);
}

void bf16_round_axpy_row(float w, const float* x, int64_t n, float* y, Isa isa) {
  if (use_avx512(isa)) return convert_detail::bf16_round_axpy_avx512(w, x, n, y);
  for (int64_t c = 0; c < n; ++c) {
    const float p = w * bf16_to_f32(f32_to_bf16(x[c]));
    y[c] += p;
  }
}

void fp8_1x128_to_bf16_row(const uint8_t* q, const float* scales, int64_t n, uint16_t* out,
                           Isa isa) {
  if (use_avx512(isa)) return convert_detail::fp8_1x128_to_bf16_avx512(q, scales, n, out);
  for (int64_t c = 0; c < n; ++c) out[c] = f32_to_bf16(fp8e4m3_to_f32(q[c]) * scales[c / 128]);
}

}  // namespace moeserve
