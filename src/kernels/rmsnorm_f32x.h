// The fast RMSNorm kernel, shared by the AVX-512F and AVX2 levels (rmsnorm_avx512f.cpp,
// rmsnorm_avx2.cpp): squares summed in FP64 over kPartials = 32 interleaved partial sums
// (element i goes to sum i % 32, whatever the vector width: four zmm of eight doubles or eight
// ymm of four), so both levels give the same bits (rmsnorm.h); then y = (x * inv) * weight a
// vector at a time, masked tails.
//
// How to use: include only from those two files, inside their anonymous namespace in
// moeserve::rmsnorm_detail, after kernels/rmsnorm.h and the level's vector type
// (kernels/vec_avx512f.h or kernels/vec_avx2.h). Everything here then has internal linkage and is
// compiled for that file's ISA only (cpu_features.h). No includes of its own.
#pragma once

constexpr int64_t kL = Vec::kLanes;
constexpr int kVecs = int(kPartials / kL);  // F32 vectors per 32 elements

// lo += (double) v[0 .. kL/2)^2 and hi += (double) v[kL/2 .. kL)^2, lane by lane.
inline void add_squares(typename Vec::T v, typename Vec::D& lo, typename Vec::D& hi) {
  const typename Vec::D a = Vec::lo_f64(v), b = Vec::hi_f64(v);
  lo = Vec::dfmadd(a, a, lo);  // each square is exact in FP64: fused or not, the same sum
  hi = Vec::dfmadd(b, b, hi);
}

// partial[j] = the sum of x[i]^2 over i % 32 == j, i < dim, in increasing i.
void row_partials(const float* x, int64_t dim, double* partial) {
  typename Vec::D acc[2 * kVecs];  // acc[2 v], acc[2 v + 1]: the halves of vector v
  for (auto& a : acc) a = Vec::dzero();
  int64_t i = 0;
  for (; i + kPartials <= dim; i += kPartials) {
    for (int v = 0; v < kVecs; ++v)
      add_squares(Vec::loadu(x + i + kL * v), acc[2 * v], acc[2 * v + 1]);
  }
  for (int v = 0; v < kVecs && i + kL * v < dim; ++v) {  // the tail, zeros past the end
    add_squares(Vec::loadu_n(x + i + kL * v, dim - i - kL * v), acc[2 * v], acc[2 * v + 1]);
  }
  for (int v = 0; v < 2 * kVecs; ++v) Vec::dstoreu(partial + kL / 2 * v, acc[v]);
}

void rmsnorm_rows(const float* x, int64_t n_rows, int64_t dim, int64_t ldx, const float* weight,
                  float eps, float* y, int64_t ldy) {
  using T = typename Vec::T;
  alignas(64) double partial[kPartials];
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    row_partials(xr, dim, partial);
    const T inv = Vec::set1(inv_rms(partial, dim, eps));
    int64_t i = 0;
    for (; i + kL <= dim; i += kL) {
      const T v = Vec::mul(Vec::loadu(xr + i), inv);
      Vec::storeu(yr + i, Vec::mul(v, Vec::loadu(weight + i)));
    }
    if (i < dim) {
      const T v = Vec::mul(Vec::loadu_n(xr + i, dim - i), inv);
      Vec::storeu_n(yr + i, Vec::mul(v, Vec::loadu_n(weight + i, dim - i)), dim - i);
    }
  }
}
