// mla_decode, AVX2 level: the FP32 piece kernel (mla_decode_f32x.h) on 8-lane ymm vectors with
// 16 registers (12-accumulator register blocks; vec_avx2.h). Compiled with -mavx2 -mfma; runs
// only when cpu_isa() says so. Everything here has internal linkage (see cpu_features.h).
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cstdint>
#include <cstring>

#include "kernels/mla_decode_internal.h"

namespace moeserve::mla_detail {
namespace {

#include "kernels/vec_avx2.h"

#include "kernels/mla_decode_f32x.h"

}  // namespace

void piece_avx2(const Ctx& ctx, const Piece& piece) {
  piece_f32(ctx, piece);
}

}  // namespace moeserve::mla_detail
