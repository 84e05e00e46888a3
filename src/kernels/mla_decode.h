// Paged MLA attention in the absorbed form (FlashMLA's contract on CPUs), for decode and for
// chunked prefill over the paged latent KV cache (docs/kv-cache.md, docs/kernels-mla.md).
//
// Every head of a sequence attends to the same cached vectors (MQA-like): token t holds
// c_t = [latent (kv_lora_rank) | rotated rope key (rope_dim)], dim = kv_lora_rank + rope_dim.
// For a query row q = [W_UK^T q_nope (kv_lora_rank) | rotated q_pe (rope_dim)] of one head:
//   s_t = softmax_scale * <q, c_t>             for t in [0, pos]  (causal: pos is q's position)
//   o   = sum_t softmax(s)_t * c_t[:kv_lora_rank]                 (the caller applies W_UV)
//   lse = log(sum_t exp(s_t))                                     (natural log)
//
// A batch is a list of sequences; sequence i has context_len tokens in the cache (its queries'
// own tokens included) and n_queries queries, at positions [context_len - n_queries,
// context_len). Decode is n_queries = 1; a prefill chunk is n_queries > 1 (causal within the
// chunk). Decodes and prefill chunks may share one call. Query and output rows are concatenated
// over the sequences in order: q [rows, heads, dim], o [rows, heads, kv_lora_rank],
// lse [rows, heads], rows = sum of n_queries.
//
// The BF16 level (AVX-512 with BF16 dot products) reads each cached token once for all heads
// (and for up to ~128 query rows of a prefill chunk): scores = Q[rows x dim] K^T per 64-token
// block, online softmax in FP32, then O += P V with BF16 products and FP32 accumulation. Long
// contexts are split over the KV length among threads; each split writes a partial o and lse
// and a combine step merges them (FlashMLA's split-KV). Numerics: BF16 queries are used as
// given (FlashMLA's contract); F32 queries are carried as BF16 hi + lo pairs (q = hi + lo to
// ~16 significant bits, two score dot products: ~1.5x the kernel's time), because rounding q
// to BF16 perturbs every score by ~2^-9 |q||c| and that alone moved the HF fixtures' logprobs
// by up to 1.4 (docs/kernels-mla.md). The softmax weights P are rounded to BF16 before P V
// unless MlaOptions::split_p carries them as hi + lo too (then the kernel agrees with the FP32
// reference to ~1e-5, at ~2x the BF16 kernel's time). Everything else is FP32.
// The reference (mla_decode_ref) is plain FP32 on the queries as given.
//
// Below the BF16 level (Isa::kAvx512 and Isa::kAvx2) the same blocking runs in FP32 on the exact
// cache values: each 64-token block is widened to F32 once (a BF16 value is the high half of its
// F32), scores are F32 FMAs of the queries as given (F32, or BF16 widened) and the cache values,
// and P stays F32, so these levels do the reference's arithmetic in another order: o agrees
// with it to ~1e-6 of the cache values' magnitude and lse to ~1e-6 relative, and both are held
// to the same bound against double-precision attention (tests/kernels/mla_decode_levels_test.cpp).
// MlaOptions::split_p does not apply.
//
// An FP8 cache (FlashMLA's format, kernels/kv_token.h) holds values e4m3 x a power-of-two
// scale, exact in BF16 and F32: the BF16 level dequantizes each 64-token block into a per-thread
// BF16 copy (74 KB for V3) and runs the BF16 kernel on it, the FP32 levels widen it to F32 as
// they widen BF16, and the reference reads tokens through kv_token_load. So every level sees
// the same values it would see in a BF16 cache holding them, and gives the same bits.
//
// Levels, for a BF16 or FP8 cache: Isa::kAvx512Bf16 runs the BF16 kernel when kv_lora_rank is a
// multiple of 32 and rope_dim is even, else the AVX-512F kernel; Isa::kAvx512 and Isa::kAvx2 run
// the FP32 kernel (zmm / ymm) when kv_lora_rank is a multiple of 16. Every other case (the scalar
// level, an F32 cache, other shapes) runs the reference, parallel over query rows. Split-KV and
// the combine are the same at every fast level. Shape or index errors are programming
// errors (CHECK): callers validate configs and block tables at their boundary (an FP8 cache
// needs kv_lora_rank % 128 == 0: kv_token_format_status). Call from one thread at a time per
// pool; distinct calls share no state (per-thread scratch only).
#pragma once

#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu_features.h"
#include "kernels/kv_token.h"

namespace moeserve {

inline constexpr int64_t kMlaBlockTokens = 64;  // = kKvBlockSize of the latent cache

// One layer's pool of cache blocks: block b's kMlaBlockTokens tokens (token.bytes() each, in the
// format of kernels/kv_token.h) start block_stride bytes after block b - 1's
// (KvCache::layer_base(layer) and block_stride_bytes()).
struct MlaCacheView {
  const void* blocks = nullptr;
  KvTokenFormat token;  // kBF16 (served), kF8E4M3 (FlashMLA's FP8) or kF32 (reference path)
  int64_t num_blocks = 0;
  int64_t block_stride = 0;  // bytes from one block to the next; 0: kMlaBlockTokens tokens
  int64_t stride() const {
    return block_stride > 0 ? block_stride : kMlaBlockTokens * token.bytes();
  }
};

struct MlaSequence {
  std::span<const int32_t> block_table;  // at least ceil(context_len / 64) block ids
  int64_t context_len = 0;               // >= n_queries
  int64_t n_queries = 1;                 // >= 0; 0 contributes no rows
};

struct MlaShape {
  int64_t heads = 0;
  int64_t kv_lora_rank = 0;
  int64_t rope_dim = 0;
  float softmax_scale = 0;
  // Leading query dims that are zero in every row (even, at most kv_lora_rank): the BF16 and AMX
  // levels skip their score products (whole 32-dim steps on AMX), which adds nothing to a score
  // (0 x a finite value), so the bits are those of the full products. The MHA form of prefill
  // (its queries are [0 (V's width) | q_nope | q_pe]) sets it.
  int64_t q_zero_dims = 0;
  int64_t dim() const { return kv_lora_rank + rope_dim; }
};

struct MlaBatch {
  MlaShape shape;
  MlaCacheView cache;
  std::span<const MlaSequence> seqs;
  const void* q = nullptr;       // [rows, heads, dim] BF16 bits or F32
  DType q_dtype = DType::kBF16;  // kBF16 or kF32
  float* o = nullptr;            // [rows, heads, kv_lora_rank]
  float* lse = nullptr;          // [rows, heads]; may be null when not needed
};

struct MlaOptions {
  // Shares the work is cut into (each share may split a sequence's KV range); 0 = the pool's
  // thread count. Results do not depend on it beyond rounding; tests vary it to force splits.
  int64_t parts = 0;
  // BF16 level only: carry the softmax weights into P V as BF16 hi + lo instead of rounding them
  // to BF16: with F32 queries that level then matches the FP32 reference to ~1e-5 (the BF16
  // latent cache itself rounds V by 2^-9, so the served path leaves this off:
  // docs/kernels-mla.md). The levels below keep P in F32 anyway.
  bool split_p = false;
  // > 0: cut every sequence's KV range at fixed multiples of this many blocks, whatever else is
  // in the batch, and spread the pieces over the parts (largest load first). A sequence's
  // result then depends only on the sequence, so a whole engine step can be one call and still
  // give each request the bits it gets alone. 0: cut the batch's work into equal shares
  // (FlashMLA's scheduler; a sequence's split depends on the rest of the batch).
  int64_t split_blocks = 0;
};

// Fills o and lse for every query row of the batch.
void mla_decode(const MlaBatch& batch, ThreadPool* pool, const MlaOptions& opt = {},
                Isa isa = active_isa());

// The scalar reference: two-pass softmax in FP32, one query row at a time (rows in parallel
// when a pool is given).
void mla_decode_ref(const MlaBatch& batch, ThreadPool* pool = nullptr);

// Total query rows of a batch (sum of n_queries).
int64_t mla_rows(std::span<const MlaSequence> seqs);

// Sparse MLA (DeepSeek Sparse Attention's attention step, DeepSeek-V3.2; docs/dsa.md): query
// row i attends to the cached tokens at `positions` (ascending, none repeated) of its sequence
// instead of a causal range. The selected tokens are gathered, in the cache's own token format,
// into blocks of a scratch arena (up to kMlaSparseWave rows' worth at a time) and mla_decode runs
// over them, each row a one-query sequence: every level, FP8 cache and option of mla_decode
// applies, and a row's result is mla_decode's on a cache that holds just its selected tokens in
// order (with split_blocks > 0, whatever else is in the batch). Gathering copies top-k x
// token.bytes() per row (2.3 MB for V3.2's 2048 BF16 tokens), a few percent of the attention's
// own time at 128 heads (docs/dsa.md).
struct MlaSparseQuery {
  std::span<const int32_t> block_table;
  std::span<const int32_t> positions;  // at least one
};

struct MlaSparseBatch {
  MlaShape shape;
  MlaCacheView cache;
  std::span<const MlaSparseQuery> queries;  // one query row each
  const void* q = nullptr;                  // [rows, heads, dim] BF16 bits or F32
  DType q_dtype = DType::kBF16;
  float* o = nullptr;    // [rows, heads, kv_lora_rank]
  float* lse = nullptr;  // [rows, heads]; may be null
};

inline constexpr int64_t kMlaSparseWave = 16;

void mla_sparse(const MlaSparseBatch& batch, ThreadPool* pool, const MlaOptions& opt = {},
                Isa isa = active_isa());

}  // namespace moeserve
