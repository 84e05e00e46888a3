// F32 building blocks of DeepSeek-V4's fast-path attention and lightning indexer
// (docs/deepseek-v4.md "Fast path"): one query (or one query's heads) against rows of F32 keys,
// as V4's cache hands them over. Levels: scalar (each dot product summed in order) and AVX-512F
// (16 lanes, so the F32 sums run in another order: within a few ulp of the sums' magnitude).
// Pure functions: any thread may call them.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"

namespace moeserve {

// out[j] = q . rows[j] for j < n; rows[j] = rows + j * ld, d values each.
void dot_rows_f32(const float* q, const float* rows, int64_t n, int64_t d, int64_t ld, float* out,
                  Isa isa = active_isa());

// out[0, d) += sum_j p[j] * rows[j] for j < n.
void axpy_rows_f32(const float* p, const float* rows, int64_t n, int64_t d, int64_t ld, float* out,
                   Isa isa = active_isa());

// The lightning indexer's score of each row: out[j] = sum_h w[h] * max(q[h] . rows[j], 0), with
// the query transposed: qt [d][heads] (relu_scores_transpose makes it, once per query). The
// AVX-512F level holds the heads across the lanes (heads a multiple of 16, d anything), four rows
// at a time, so a row is read once for all heads.
void relu_scores_f32(const float* qt, const float* w, int64_t heads, const float* rows, int64_t n,
                     int64_t d, int64_t ld, float* out, Isa isa = active_isa());
// qt [d][heads] from q [heads][d].
void relu_scores_transpose(const float* q, int64_t heads, int64_t d, float* qt);

namespace attend_f32_detail {
void dot_rows_avx512(const float* q, const float* rows, int64_t n, int64_t d, int64_t ld,
                     float* out);
void axpy_rows_avx512(const float* p, const float* rows, int64_t n, int64_t d, int64_t ld,
                      float* out);
void relu_scores_avx512(const float* q, const float* w, int64_t heads, const float* rows, int64_t n,
                        int64_t d, int64_t ld, float* out);
}  // namespace attend_f32_detail

}  // namespace moeserve
