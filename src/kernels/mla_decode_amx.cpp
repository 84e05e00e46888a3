// mla_decode, AMX level: the BF16 kernel of mla_decode_avx512.cpp with its two products (Q K^T,
// P V) on the tile unit (TDPBF16PS); the packing, the online softmax, the FP8 dequantization and
// the split-KV driver are that kernel's own (mla_decode_bf16_body.h). docs/kernels-amx.md, "MLA".
// Compiled with -mavx512{f,bw,vl,dq,bf16} -mamx-{tile,bf16,int8}; runs only when cpu_isa() says so.
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm_fp8_internal.h"  // load_tile_config_16x64
#include "kernels/mla_decode_internal.h"

namespace moeserve::mla_detail {
namespace {
#include "kernels/mla_decode_bf16_body.h"

}  // namespace

void piece_amx(const Ctx& c, const Piece& pc) {
  gemm_detail::load_tile_config_16x64();
  piece_bf16<true>(c, pc);
  _tile_release();
}

}  // namespace moeserve::mla_detail
