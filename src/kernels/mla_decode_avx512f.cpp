// mla_decode, AVX-512F level: the FP32 piece kernel (mla_decode_f32x.h) on 16-lane zmm vectors
// with 32 registers (24-accumulator register blocks; vec_avx512f.h). Compiled with
// -mavx512{f,bw,vl,dq} -mfma; runs only when cpu_isa() says so. Everything here has internal
// linkage (see cpu_features.h).
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cstdint>
#include <cstring>

#include "kernels/mla_decode_internal.h"

namespace moeserve::mla_detail {
namespace {

#include "kernels/vec_avx512f.h"

#include "kernels/mla_decode_f32x.h"

}  // namespace

void piece_avx512f(const Ctx& ctx, const Piece& piece) {
  piece_f32(ctx, piece);
}

}  // namespace moeserve::mla_detail
