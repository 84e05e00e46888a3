// FP32 FMA register loop for CPUs without AVX-512 BF16; compiled for AVX2 + FMA.
#include <immintrin.h>

#include "machine.h"

namespace moeserve::bench {

double fma_f32_loop(long iters) {
  __m256 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps(float(j));  // distinct: no CSE
  __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(1e-9f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(a, b, acc[j]);
    __asm__ volatile("" : "+v"(a));
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
  return double(iters) * 12 * 16;
}

}  // namespace moeserve::bench
