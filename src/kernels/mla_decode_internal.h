// Internal to mla_decode: the unit of work the fast levels implement. Plain data only, and no
// includes that carry inline code (see cpu_features.h on why ISA files share no inline code).
#pragma once

#include <cstddef>
#include <cstdint>

namespace moeserve::mla_detail {

constexpr int64_t kFp8Tile =
    128;  // latent values per FP8 scale (kKvFp8Tile; mla_decode.cpp checks)

struct Ctx {
  const uint8_t* blocks;  // the pool: block b's 64 tokens at blocks + b * block_stride
  int64_t block_stride;   // bytes
  int64_t token_bytes;    // one token: dim BF16 values, or the FP8 format (kv_token.h)
  // FP8 tokens: kv_lora_rank e4m3 at 0, one F32 scale per kFp8Tile of them at kv_lora_rank,
  // rope_dim BF16 at fp8_rope_offset; the kernels dequantize each block before using it.
  bool fp8;
  int64_t fp8_rope_offset;
  int64_t heads, kv_lora_rank, dim;
  float softmax_scale;
  bool q_split;          // BF16 level: F32 queries as BF16 hi + lo (two score dot products)
  bool p_split;          // BF16 level: softmax weights as BF16 hi + lo (two P V products)
  int64_t q_zero_pairs;  // MlaShape::q_zero_dims / 2: leading BF16 pairs of Q that are zero
  // Distinct for every mla_decode call: a thread that runs several pieces of one group in a
  // call may keep the group's packed queries between them (BF16 level).
  uint64_t call_id;
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
  // The tokens of the first block the calling thread works on after this piece (null if
  // none): a kernel may prefetch them while it works on its own last block.
  const void* next_block;
  int64_t next_bytes;
};

// One piece at each fast level: BF16 dot products (kv_lora_rank % 32 == 0, rope_dim even), and
// the FP32 kernel of mla_decode_f32x.h on zmm and on ymm vectors (kv_lora_rank % 16 == 0).
void piece_avx512bf16(const Ctx& ctx, const Piece& piece);
// The BF16 kernel with Q K^T and P V on the AMX tile unit ((kv_lora_rank + rope_dim) % 32 == 0).
void piece_amx(const Ctx& ctx, const Piece& piece);
void piece_avx512f(const Ctx& ctx, const Piece& piece);
void piece_avx2(const Ctx& ctx, const Piece& piece);

}  // namespace moeserve::mla_detail

namespace moeserve {
struct MlaBatch;
}

namespace moeserve::mla_detail {

// CHECKs the batch's shapes, block tables and buffers (mla_decode.cpp).
void validate(const MlaBatch& batch);

// Carves the calling thread's kernel scratch into n parts of bytes[i] each, every part 64-byte
// aligned, into parts[i]. The scratch grows on demand and is kept for the thread's lifetime
// (mla_decode.cpp; one definition for every level).
void thread_scratch_parts(const size_t* bytes, size_t n, char** parts);

}  // namespace moeserve::mla_detail
