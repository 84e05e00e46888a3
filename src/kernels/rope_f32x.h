// The fast RoPE rotation, shared by the AVX-512F and AVX2 levels (rope_avx512f.cpp,
// rope_avx2.cpp): a vector of values (kLanes / 2 pairs) per step, each pair's partner brought
// alongside by an in-lane swap; products and sums rounded separately as in RopeTable::apply
// (both files are built with -ffp-contract=off), so every level gives apply()'s bits (rope.h).
//
// How to use: include only from those two files, inside their anonymous namespace in
// moeserve::rope_detail, after kernels/rope.h and the level's vector type (kernels/vec_avx512f.h
// or kernels/vec_avx2.h). Everything here then has internal linkage and is compiled for that
// file's ISA only (cpu_features.h). No includes of its own.
#pragma once

constexpr int64_t kL = Vec::kLanes;

// (a, b) -> (a c - b s, b c + a s) per pair (s holds (-s, s)).
inline typename Vec::T rotate(typename Vec::T v, typename Vec::T c, typename Vec::T s) {
  return Vec::add(Vec::mul(v, c), Vec::mul(Vec::swap_pairs(v), s));
}

void rotate_rows(const float* cos2, const float* sin2, int64_t dim, float* x, int64_t n_rows,
                 int64_t ld) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* v = x + r * ld;
    int64_t i = 0;
    for (; i + kL <= dim; i += kL) {
      Vec::storeu(v + i, rotate(Vec::loadu(v + i), Vec::loadu(cos2 + i), Vec::loadu(sin2 + i)));
    }
    if (i < dim) {
      const int64_t n = dim - i;
      Vec::storeu_n(
          v + i,
          rotate(Vec::loadu_n(v + i, n), Vec::loadu_n(cos2 + i, n), Vec::loadu_n(sin2 + i, n)), n);
    }
  }
}
