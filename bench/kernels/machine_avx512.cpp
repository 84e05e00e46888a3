// Register loops for the compute peak; compiled for AVX-512 + BF16, called only when the CPU
// has it (machine.cpp checks).
#include <immintrin.h>

#include "machine.h"

namespace moeserve::bench {

// 16 independent accumulators cover vdpbf16ps's latency at full throughput.
double dpbf16_loop(long iters) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_set1_ps(float(j));  // distinct: no CSE
  __m512i ai = _mm512_set1_epi16(0x3f80), bi = _mm512_set1_epi16(0x3f81);
  __m512bh a = reinterpret_cast<__m512bh&>(ai), b = reinterpret_cast<__m512bh&>(bi);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
    __asm__ volatile("" : "+v"(a));
  }
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
  return double(iters) * 16 * 64;  // 16 lanes x 2 pairs x (mul + add)
}

double dpbusd_loop(long iters) {
  __m512i acc[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_set1_epi32(j);  // distinct: no CSE
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
    __asm__ volatile("" : "+v"(a));
  }
  __m512i s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_epi32(s, acc[i]);
  alignas(64) int32_t out[16];
  _mm512_store_si512(out, s);
  volatile int32_t sink = out[0];
  (void)sink;
  return double(iters) * 16 * 128;  // 16 lanes x 4 bytes x (mul + add)
}

}  // namespace moeserve::bench
