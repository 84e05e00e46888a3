// Register loops for the AMX peak; compiled for AMX, called only when the CPU has it and the OS
// granted the tile state (machine.cpp checks cpu_isa()).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "machine.h"

namespace moeserve::bench {
namespace {

// Eight 16-row x 64-byte tiles: C 0-3, A 4-5, B 6-7 (as the GEMM kernel uses them).
void configure() {
  struct alignas(64) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // GCC 12 does not see that LDTILECFG reads the whole struct and drops stores to it.
  __asm__ volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

// Four independent accumulators, each 16 x 16 x 32 BF16 (or 16 x 16 x 64 INT8) multiply-adds per
// instruction; the operands stay in tiles, so only the tile unit's rate counts.
template <bool kInt8>
double amx_loop(long iters) {
  configure();
  alignas(64) static uint8_t ones[16 * 64];
  for (int i = 0; i < 16 * 64; i += 2) {  // BF16 1.0 (0x3f80), or INT8 bytes 0x80 and 0x3f
    ones[i] = 0x80;
    ones[i + 1] = 0x3f;
  }
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long i = 0; i < iters; ++i) {
    if constexpr (kInt8) {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    } else {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) static thread_local uint32_t out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  volatile uint32_t sink = out[0];
  (void)sink;
  return double(iters) * 4 * 16 * 16 * (kInt8 ? 64 : 32) * 2;
}

}  // namespace

double amx_bf16_loop(long iters) {
  return amx_loop<false>(iters);
}

double amx_int8_loop(long iters) {
  return amx_loop<true>(iters);
}

}  // namespace moeserve::bench
