// Internal to mla_decode: the unit of work the fast level implements. Plain data only, and no
// includes that carry inline code (see cpu_features.h on why ISA files share no inline code).
#pragma once

#include <cstdint>

namespace moeserve::mla_detail {

struct Ctx {
  const uint16_t* blocks;  // BF16 pool [num_blocks][64][dim]
  int64_t heads, kv_lora_rank, dim;
  float softmax_scale;
  bool q_split;  // F32 queries as BF16 hi + lo: two score dot products (~16 mantissa bits)
  bool p_split;  // softmax weights as BF16 hi + lo: two P V products
};

// A group of consecutive query rows of one sequence (n_q queries x heads rows) attending to the
// cache blocks [b0, b1) of that sequence. Writes, per row, the softmax-normalised o over those
// blocks and their lse (natural log; -inf and o = 0 for a row that sees no token there).
struct Piece {
  const void* q;  // [n_q, heads, dim], BF16 bits or F32
  bool q_bf16;
  int64_t n_q;
  int64_t first_pos;  // position of the first query; row (i, h) sees tokens [0, first_pos + i]
  const int32_t* block_table;
  int64_t context_len;
  int64_t b0, b1;
  float* o;    // [n_q * heads, kv_lora_rank]
  float* lse;  // [n_q * heads] or null
};

void piece_avx512bf16(const Ctx& ctx, const Piece& piece);

}  // namespace moeserve::mla_detail

namespace moeserve {
struct MlaBatch;
}

namespace moeserve::mla_detail {

// CHECKs the batch's shapes, block tables and buffers (mla_decode.cpp).
void validate(const MlaBatch& batch);

}  // namespace moeserve::mla_detail
