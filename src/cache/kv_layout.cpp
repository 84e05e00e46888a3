#include "cache/kv_layout.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/check.h"
#include "kernels/index_fp4.h"

namespace moeserve {

const char* kv_part_kind_name(KvPartKind k) {
  switch (k) {
    case KvPartKind::kLatent:
      return "latent";
    case KvPartKind::kIndexKey:
      return "index key";
    case KvPartKind::kCompressed:
      return "compressed";
    case KvPartKind::kState:
      return "state";
  }
  return "?";
}

int64_t KvPart::entries() const {
  if (kind == KvPartKind::kState) return 1;
  return ratio >= kKvBlockSize ? 1 : kKvBlockSize / ratio;
}

int64_t KvPart::entry_bytes() const {
  switch (kind) {
    case KvPartKind::kLatent:
    case KvPartKind::kCompressed:
      return token.bytes();
    case KvPartKind::kIndexKey:
      switch (index_dtype) {
        case DType::kF32:
          return index_dim * 4;
        case DType::kF4E2M1:
          return fp4_index_key_bytes(index_dim);  // e2m1 pairs, then a UE8M0 byte per 32
        default:
          return index_dim + 4;  // e4m3 values, then the F32 scale
      }
    case KvPartKind::kState:
      return state_bytes;
  }
  return 0;
}

int64_t KvLayerFormat::bytes() const {
  int64_t b = 0;
  for (const KvPart& p : parts) b += p.bytes();
  return b;
}

KvLayout::KvLayout(int64_t n, KvTokenFormat t)
    : KvLayout(std::vector<KvLayerFormat>(size_t(n), KvLayerFormat{{KvPart::latent(t)}, 0})) {}

KvLayout::KvLayout(std::vector<KvLayerFormat> layers) : layers_(std::move(layers)) {
  index();
}

void KvLayout::index() {
  n_layers = int64_t(layers_.size());
  token = {};
  window_ = 0;
  bool have_latent = false;
  part_offset_.assign(layers_.size(), {});
  for (const KvLayerFormat& l : layers_) {
    window_ = std::max(window_, l.window);
    for (const KvPart& p : l.parts) {
      if (p.kind != KvPartKind::kLatent) continue;
      CHECK(!have_latent || p.token == token, "every latent part of a layout has one format");
      token = p.token;
      have_latent = true;
    }
  }
  // The main region, layer by layer, then the window region.
  size_t off = 0;
  for (bool window_region : {false, true}) {
    if (window_region) main_bytes_ = off;
    for (int64_t l = 0; l < n_layers; ++l) {
      const std::vector<KvPart>& parts = layers_[size_t(l)].parts;
      part_offset_[size_t(l)].resize(parts.size());
      for (size_t p = 0; p < parts.size(); ++p) {
        if (windowed(l, p) != window_region) continue;
        part_offset_[size_t(l)][p] = off;
        off += size_t(parts[p].bytes());
      }
    }
  }
  block_bytes_ = off;
}

bool KvLayout::windowed(int64_t l, size_t p) const {
  const KvLayerFormat& layer = layers_[size_t(l)];
  switch (layer.parts[p].kind) {
    case KvPartKind::kLatent:
      return layer.window > 0;
    case KvPartKind::kState:  // read only by a step starting right after its block
      return window_ > 0;
    default:
      return false;
  }
}

int32_t KvLayout::window_blocks() const {
  return window_ <= 1 ? 0 : int32_t((window_ - 1 + kKvBlockSize - 1) / kKvBlockSize);
}

int64_t KvLayout::find_part(int64_t l, KvPartKind kind) const {
  const std::vector<KvPart>& parts = layers_[size_t(l)].parts;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].kind == kind) return int64_t(i);
  }
  return -1;
}

Status kv_layout_status(const KvLayout& layout) {
  for (int64_t l = 0; l < layout.n_layers; ++l) {
    const KvLayerFormat& layer = layout.layer(l);
    if (layer.window < 0) return InvalidArgument(fmt::format("KV layer {}: negative window", l));
    for (const KvPart& p : layer.parts) {
      const std::string what = fmt::format("KV layer {}'s {} part", l, kv_part_kind_name(p.kind));
      switch (p.kind) {
        case KvPartKind::kLatent:
        case KvPartKind::kCompressed:
          if (Status st = kv_token_format_status(p.token); !st.ok()) return st;
          break;
        case KvPartKind::kIndexKey:
          if (p.index_dim < 1) return InvalidArgument(what + ": index_dim must be >= 1");
          if (p.index_dtype != DType::kF8E4M3 && p.index_dtype != DType::kF32 &&
              p.index_dtype != DType::kF4E2M1) {
            return InvalidArgument(what + ": index keys are FP8 (with a scale), FP4 or F32");
          }
          if (p.index_dtype == DType::kF4E2M1 && p.index_dim % kFp4Block != 0) {
            return InvalidArgument(what + ": FP4 index keys are whole 32-value blocks");
          }
          break;
        case KvPartKind::kState:
          if (p.state_bytes < 1) return InvalidArgument(what + ": state_bytes must be >= 1");
          break;
      }
      if (p.ratio < 1 || (p.ratio < kKvBlockSize && kKvBlockSize % p.ratio != 0) ||
          (p.ratio > kKvBlockSize && p.ratio % kKvBlockSize != 0)) {
        return InvalidArgument(fmt::format(
            "{}: {} tokens per entry neither divides nor is a multiple of the {}-token block", what,
            p.ratio, kKvBlockSize));
      }
      if (p.kind == KvPartKind::kLatent && p.ratio != 1) {
        return InvalidArgument(what + ": a latent is one entry per token");
      }
    }
  }
  return Status::Ok();
}

}  // namespace moeserve
