// The fast path's prepared weights on disk (docs/memory.md). Preparing a checkpoint repacks
// every FP8 projection into gemm_fp8's tiles (or requantizes it for gemm_int8), DeepSeek-V4's FP4
// experts into gemm_fp4's, and the lm_head into gemm_bf16's: seconds for the bench preset, most of
// an hour for DeepSeek-V3's 690 GB. With a cache directory the first start writes what it prepared
// to one file and every later start maps that file instead: the tiles are used where they lie in
// the mapping (file-backed pages, no conversion, no copy).
//
// One file per key (weight_cache_path): the caller's key covers everything that decides the
// prepared bytes (the model fingerprint, the INT8 options, which tensors this process holds
// and where they lie in the checkpoint, the layout version). The file holds its key, a table
// of entries (kind, shape, offsets, an XXH3 checksum of each entry's bytes) and the entries,
// each 4096-byte aligned. load_weight_cache() checks the table and every entry's checksum (a
// pass over the file's pages, which the weights need resident anyway), so a torn, truncated or
// bit-flipped file is an error naming the file, never wrong weights. Files are written to a
// temporary name and renamed into place: processes sharing a directory never see half a file.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <xxhash.h>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/gemm_fp4.h"
#include "kernels/gemm_fp8.h"
#include "kernels/gemm_int4.h"
#include "kernels/gemm_int8.h"
#include "kernels/weight_view.h"

namespace moeserve {

struct WeightCacheOptions {
  std::string dir;         // empty: no cache
  uint64_t model_key = 0;  // the model fingerprint (model/fingerprint.h)
};

// One prepared weight, in preparation order; exactly one pointer is set. Saving reads it;
// loading fills it (shape, bytes, scales) from the file.
struct CachedWeight {
  PackedFp8Weight* fp8 = nullptr;
  PackedInt8Weight* int8 = nullptr;
  PackedBf16Weight* bf16 = nullptr;
  std::vector<int32_t>* rows = nullptr;  // plain int32 values (a compact lm_head's row ids)
  PackedInt4Weight* int4 = nullptr;
  PackedFp4Weight* fp4 = nullptr;  // DeepSeek-V4's experts (their exponents inside the tiles)
};

std::string weight_cache_path(const std::string& dir, uint64_t key);

// Adds where `w` lies in the checkpoint (its shard's file name, byte offset, rows and columns)
// to a cache key's hash; false when `w` is not in a mapped checkpoint file (weights built in
// memory: not cached).
bool add_weight_place(XXH3_state_t* st, const WeightView& w);

// Writes the file (IOError naming it when that fails; nothing is left behind then).
Status save_weight_cache(const std::string& path, uint64_t key,
                         std::span<const CachedWeight> items);

// NotFound when there is no file; Corrupt naming the file when it is not a whole cache for `key`
// with these kinds of items. `pool` (may be null) checks the entries' checksums in parallel.
Status load_weight_cache(const std::string& path, uint64_t key, std::span<CachedWeight> items,
                         ThreadPool* pool = nullptr);

}  // namespace moeserve
