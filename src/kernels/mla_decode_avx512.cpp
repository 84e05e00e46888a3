// mla_decode, AVX-512 + BF16 level: one piece (a group of query rows x a range of cache blocks)
// per call, one 64-token cache block per tile. Per tile (docs/kernels-mla.md):
//   0. An FP8 cache's block is first dequantized to BF16 rows in per-thread scratch (exact), and
//      the steps below read that copy instead of the pool.
//   1. S[t][row] = <Q[row], K[t]>: rows (query x head) in the 16 lanes, Q packed as BF16 pairs
//      [dim/2][rows] (16 x 16 transposes; once per group and thread in a call, not per piece);
//      each token's pair K[t][2d..2d+1] is broadcast once per register block (vpbroadcastd),
//      so every cached value is read once for all rows. A tile stops at the last token the
//      group's last query sees (the diagonal tile of a prefill chunk).
//   2. Online softmax over the tile in FP32 (base 2, the scale folded into the exponent), causal
//      and past-the-end tokens masked per lane (no mask for row vectors that see the whole
//      tile); P rounded to BF16 pairs [t/2][rows].
//   3. O[row][:] = alpha * O + P V: V (the latent) re-laid as token pairs [t/2][kv_lora_rank][2]
//      with two unpacks per 32 values, rows broadcast, kv_lora_rank in the lanes. Meanwhile the
//      next block (of the piece, or the thread's next piece) is prefetched to L2.
// None of this changes a row's arithmetic: results are bit-identical to computing every tile
// in full, and a row's result does not depend on the other rows of its group.
// Compiled with -mavx512{f,bw,vl,dq,bf16}; runs only when cpu_isa() says so. Everything here has
// internal linkage and no standard-library templates (see cpu_features.h).
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cstdint>
#include <cstring>

#include "kernels/mla_decode_internal.h"

namespace moeserve::mla_detail {
namespace {
#include "kernels/mla_decode_bf16_body.h"

}  // namespace

void piece_avx512bf16(const Ctx& c, const Piece& pc) {
  piece_bf16<false>(c, pc);
}

}  // namespace moeserve::mla_detail
