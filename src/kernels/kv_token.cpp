#include "kernels/kv_token.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/check.h"

namespace moeserve {

namespace {

// n BF16 values at dst / src, which may be only 2-byte aligned (memcpy: no aliasing games).
void store_bf16(const float* v, int64_t n, uint8_t* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = f32_to_bf16(v[i]);
    std::memcpy(dst + 2 * i, &b, 2);
  }
}

void load_bf16(const uint8_t* src, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, src + 2 * i, 2);
    out[i] = bf16_to_f32(b);
  }
}

}  // namespace

int64_t KvTokenFormat::bytes() const {
  switch (dtype) {
    case DType::kF32:
      return dim() * 4;
    case DType::kBF16:
      return dim() * 2;
    case DType::kF8E4M3:
      return fp8_rope_offset() + rope_dim * 2;
    default:
      break;
  }
  CHECK(false, "a KV token is F32, BF16 or FP8");
  return 0;
}

Status kv_token_format_status(const KvTokenFormat& f) {
  if (f.kv_lora_rank <= 0 || f.rope_dim < 0) {
    return InvalidArgument(
        fmt::format("a latent KV token of {} + {} values", f.kv_lora_rank, f.rope_dim));
  }
  if (f.dtype != DType::kF32 && f.dtype != DType::kBF16 && f.dtype != DType::kF8E4M3) {
    return InvalidArgument(
        fmt::format("the latent KV cache is F32, BF16 or FP8, not {}", dtype_name(f.dtype)));
  }
  if (f.dtype == DType::kF8E4M3 && f.kv_lora_rank % f.fp8_tile() != 0) {
    return InvalidArgument(fmt::format(
        "an FP8 KV cache needs kv_lora_rank to be a multiple of {} (its format has one scale per "
        "{} latent values); this model's kv_lora_rank is {}: use bf16",
        f.fp8_tile(), f.fp8_tile(), f.kv_lora_rank));
  }
  return Status::Ok();
}

float kv_fp8_tile_scale(float amax, KvFp8Layout layout) {
  // FlashMLA's floor on the inverse scale keeps an all-zero tile finite; V4's model.py floors
  // amax instead.
  const float s = layout == KvFp8Layout::kV4 ? std::max(amax, 1e-4f) * (1.0f / kFp8E4M3Max)
                                             : std::max(amax / kFp8E4M3Max, 1e-4f);
  if (!std::isfinite(s)) return s;  // an inf in the tile: nothing sensible to store
  // 2^ceil(log2(s)), exactly: s when it is a power of two, else the next one up.
  int e = 0;
  const float m = std::frexp(s, &e);  // s = m 2^e, m in [0.5, 1)
  return m == 0.5f ? s : std::ldexp(1.0f, e);
}

void kv_token_store(const KvTokenFormat& f, const float* v, uint8_t* token) {
  const int64_t R = f.kv_lora_rank;
  if (f.dtype == DType::kF32) {
    std::memcpy(token, v, size_t(f.dim()) * 4);
    return;
  }
  if (f.dtype == DType::kBF16) {
    store_bf16(v, f.dim(), token);
    return;
  }
  const int64_t tile = f.fp8_tile();
  for (int64_t t0 = 0; t0 < R; t0 += tile) {
    float amax = 0.0f;  // (a NaN never wins)
    for (int64_t i = t0; i < t0 + tile; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float s = kv_fp8_tile_scale(amax, f.fp8);
    for (int64_t i = t0; i < t0 + tile; ++i) {
      token[i] = f32_to_fp8e4m3(v[i] / s);  // x / s is exact: s is a power of two
    }
    uint8_t* at = token + f.fp8_scales_offset() + t0 / tile * f.fp8_scale_bytes();
    if (f.fp8 == KvFp8Layout::kV4) {
      int e = 0;
      std::frexp(s, &e);  // s = 2^(e - 1)
      *at = uint8_t(std::clamp(e - 1 + 127, 0, 254));
    } else {
      std::memcpy(at, &s, 4);
    }
  }
  store_bf16(v + R, f.rope_dim, token + f.fp8_rope_offset());
}

void kv_token_load(const KvTokenFormat& f, const uint8_t* token, float* out) {
  const int64_t R = f.kv_lora_rank;
  if (f.dtype == DType::kF32) {
    std::memcpy(out, token, size_t(f.dim()) * 4);
    return;
  }
  if (f.dtype == DType::kBF16) {
    load_bf16(token, f.dim(), out);
    return;
  }
  const int64_t tile = f.fp8_tile();
  for (int64_t t0 = 0; t0 < R; t0 += tile) {
    const uint8_t* at = token + f.fp8_scales_offset() + t0 / tile * f.fp8_scale_bytes();
    float s;
    if (f.fp8 == KvFp8Layout::kV4) {
      s = f8e8m0_to_f32(*at);
    } else {
      std::memcpy(&s, at, 4);
    }
    for (int64_t i = t0; i < t0 + tile; ++i) out[i] = fp8e4m3_to_f32(token[i]) * s;
  }
  load_bf16(token + f.fp8_rope_offset(), f.rope_dim, out + R);
}

}  // namespace moeserve
