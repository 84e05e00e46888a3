// The fast silu(g) * u, shared by the AVX-512F and AVX2 levels (silu_mul_avx512f.cpp,
// silu_mul_avx2.cpp), a vector of values per step (silu_mul.h). exp(x), x = -g clamped to
// [-80, 88.75]: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2 in two parts, the
// first with 9 significant bits so n * ln2_hi is exact), e^r = 1 + r + r^2 P(r) with P of degree
// 4 fitted here for minimax relative error (about 3e-9 before F32 rounding), then e^x =
// e^r * 2^(n-1) * 2, which reaches inf as std::exp does above ln(FLT_MAX). Below x = -80 the
// clamp changes nothing: 1 + e^x is already exactly 1 from x < -17. Both files are built with
// -ffp-contract=off (every fused multiply-add is written out), so both levels give the same bits.
//
// How to use: include only from those two files, inside their anonymous namespace in
// moeserve::silu_mul_detail, after kernels/silu_mul.h and the level's vector type
// (kernels/vec_avx512f.h or kernels/vec_avx2.h). Everything here then has internal linkage and is
// compiled for that file's ISA only (cpu_features.h). No includes of its own.
#pragma once

constexpr int64_t kL = Vec::kLanes;

inline typename Vec::T silu_mul_v(typename Vec::T g, typename Vec::T u) {
  using T = typename Vec::T;
  const T one = Vec::set1(1.0f);
  T x = Vec::sub(Vec::zero(), g);
  // max/min return their second operand for a NaN x: the exp stays finite, g / (1 + e) is NaN.
  x = Vec::min(Vec::max(x, Vec::set1(-80.0f)), Vec::set1(88.75f));
  const T n = Vec::round(Vec::mul(x, Vec::set1(0x1.715476p+0f)));
  T r = Vec::fnmadd(n, Vec::set1(0x1.63p-1f), x);      // x - n ln2_hi, exact
  r = Vec::fnmadd(n, Vec::set1(-0x1.bd0106p-13f), r);  // - n ln2_lo
  T p = Vec::fmadd(Vec::set1(0x1.6a243ep-10f), r, Vec::set1(0x1.1239d4p-7f));
  p = Vec::fmadd(p, r, Vec::set1(0x1.5558f2p-5f));
  p = Vec::fmadd(p, r, Vec::set1(0x1.555492p-3f));
  p = Vec::fmadd(p, r, Vec::set1(0x1.fffffcp-2f));
  const T er = Vec::add(Vec::fmadd(p, Vec::mul(r, r), r), one);  // e^r
  // 2^(n-1): n in [-115, 128], so the biased exponent n + 126 is in [11, 254].
  const T e = Vec::mul(Vec::mul(er, Vec::pow2(n, 126)), Vec::set1(2.0f));
  return Vec::mul(Vec::div(g, Vec::add(one, e)), u);
}

void silu_mul_to_f32(const float* g, const float* u, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + kL <= n; i += kL) {
    Vec::storeu(out + i, silu_mul_v(Vec::loadu(g + i), Vec::loadu(u + i)));
  }
  if (i < n) {
    Vec::storeu_n(out + i, silu_mul_v(Vec::loadu_n(g + i, n - i), Vec::loadu_n(u + i, n - i)),
                  n - i);
  }
}

void silu_mul_to_bf16(const float* g, const float* u, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + kL <= n; i += kL) {
    Vec::storeu_bf16(out + i, silu_mul_v(Vec::loadu(g + i), Vec::loadu(u + i)));
  }
  if (i < n) {
    Vec::storeu_bf16_n(out + i, silu_mul_v(Vec::loadu_n(g + i, n - i), Vec::loadu_n(u + i, n - i)),
                       n - i);
  }
}
