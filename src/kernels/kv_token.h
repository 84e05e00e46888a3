// The byte format of one cached latent token of one layer (the paged KV cache's unit, read by
// mla_decode and written by KvCache): kv_lora_rank normalised latent values, then rope_dim
// rotated rope-key values (docs/kv-cache.md), stored in one of three formats:
//
//   kF32      dim F32 values (the reference path)
//   kBF16     dim BF16 values (the served default): 2 * dim bytes, 1,152 for V3
//   kF8E4M3   FlashMLA's "FP8 with scale" (the KV cache of DeepSeek-V3.2; FlashMLA's README
//             and tests/quant.py): kv_lora_rank e4m3 bytes, then kv_lora_rank / 128 F32 scales
//             (one per 128-value tile), then rope_dim BF16 values (the rope key is not
//             quantized): 512 + 16 + 128 = 656 bytes for V3.
//             Or, with KvFp8Layout::kV4, DeepSeek-V4's (its model.py rounds the KV's non-RoPE
//             values to FP8 per 64 with a power-of-two scale): 64-value tiles, each scale one
//             UE8M0 byte (2^(b - 127)): 448 + 7 + 128 = 583 bytes for V4's 512-value head.
//
// FP8 tiles: s = 2^ceil(log2(max(amax / 448, 1e-4))) with amax the tile's largest |x| (a power
// of two, as FlashMLA's UE8M0 scales; V4's: 2^ceil(log2(max(amax, 1e-4) / 448)), model.py's
// act_quant), q = e4m3(x / s) rounded to nearest even; the value read
// back is e4m3(q) * s. That product is exact in F32 and in BF16 (a power-of-two multiple of a
// 4-bit significand), so a kernel may dequantize to either and see the same values. Error per
// value: at most 2^-4 * max(amax, 2^-19) (half an e4m3 step; 2^-19 is where the 1e-4 floor on
// s turns the tile's small values subnormal). The format needs kv_lora_rank % 128 == 0
// (kv_token_format_status). A byte 0x7f / 0xff (e4m3 NaN) is never written.
//
// Pure functions of their arguments: any thread may call them.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"

namespace moeserve {

inline constexpr int64_t kKvFp8Tile = 128;   // latent values per FP8 scale (FlashMLA's)
inline constexpr int64_t kKvFp8TileV4 = 64;  // DeepSeek-V4's

// Which FP8 token layout (above): FlashMLA's (V3, V3.2: what mla_decode reads) or V4's.
enum class KvFp8Layout : uint8_t { kFlashMla, kV4 };

struct KvTokenFormat {
  DType dtype = DType::kBF16;  // kF32, kBF16 or kF8E4M3 (the FP8 format above)
  int64_t kv_lora_rank = 0;
  int64_t rope_dim = 0;
  KvFp8Layout fp8 = KvFp8Layout::kFlashMla;  // kF8E4M3 only

  int64_t dim() const { return kv_lora_rank + rope_dim; }
  // Bytes of one token.
  int64_t bytes() const;
  // FP8: values per scale, bytes per scale, and the byte offsets of the scales and of the BF16
  // rope key within a token.
  int64_t fp8_tile() const { return fp8 == KvFp8Layout::kV4 ? kKvFp8TileV4 : kKvFp8Tile; }
  int64_t fp8_scale_bytes() const { return fp8 == KvFp8Layout::kV4 ? 1 : 4; }
  int64_t fp8_scales_offset() const { return kv_lora_rank; }
  int64_t fp8_rope_offset() const {
    return kv_lora_rank + kv_lora_rank / fp8_tile() * fp8_scale_bytes();
  }
  friend bool operator==(const KvTokenFormat&, const KvTokenFormat&) = default;
};

// Ok, or InvalidArgument saying why tokens of this shape cannot be stored in this format (an
// FP8 cache needs kv_lora_rank to be a multiple of the tile; only the three dtypes above exist).
Status kv_token_format_status(const KvTokenFormat& f);

// The FP8 scale of a tile whose largest magnitude is amax (see above).
float kv_fp8_tile_scale(float amax, KvFp8Layout layout = KvFp8Layout::kFlashMla);

// Stores dim values v (the latent, then the rope key) as one token: F32 copied, BF16 rounded to
// nearest even, FP8 quantized as above.
void kv_token_store(const KvTokenFormat& f, const float* v, uint8_t* token);
// Reads one token back as dim floats (exact for every format).
void kv_token_load(const KvTokenFormat& f, const uint8_t* token, float* out);

}  // namespace moeserve
