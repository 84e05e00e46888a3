// Routed experts installed and dropped at run time: the wire format (expert_store.h) and the
// ExpertStore, the table of run-time experts over the checkpoint's that V3's and V4's models read.
#include "model/expert_store.h"

#include <cstring>

#include <fmt/format.h>

#include "core/file_pages.h"
#include "model/deepseek.h"
#include "model/deepseek_v4_weights.h"

namespace moeserve {

namespace {

constexpr uint32_t kMagic = 0x3158534d;  // "MSX1"
constexpr uint32_t kMatrices = 3;

struct MatrixHeader {
  uint32_t dtype = 0, zero = 0;
  int64_t rows = 0, cols = 0, block_rows = 0, block_cols = 0;
  uint64_t data_bytes = 0, scales = 0;
};
static_assert(sizeof(MatrixHeader) == 56);
constexpr size_t kHeaderBytes = 8 + kMatrices * sizeof(MatrixHeader);

uint64_t scale_count(const WeightView& w) {
  if (!w.block_scaled()) return 0;
  return uint64_t(((w.rows + w.block_rows - 1) / w.block_rows) *
                  ((w.cols + w.block_cols - 1) / w.block_cols));
}

const WeightView* matrix(const MlpWeights& w, uint32_t i) {
  return i == 0 ? &w.gate : i == 1 ? &w.up : &w.down;
}

bool known_weight_dtype(uint32_t d) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF4E2M1}) {
    if (d == uint32_t(t)) return true;
  }
  return false;
}

}  // namespace

ExpertBlob encode_expert(const MlpWeights& w, std::shared_ptr<const void> keep) {
  auto header = std::make_shared<std::vector<uint8_t>>(kHeaderBytes);
  uint8_t* p = header->data();
  std::memcpy(p, &kMagic, 4);
  std::memcpy(p + 4, &kMatrices, 4);
  ExpertBlob blob;
  blob.parts.push_back(*header);
  for (uint32_t i = 0; i < kMatrices; ++i) {
    const WeightView& v = *matrix(w, i);
    MatrixHeader h;
    h.dtype = uint32_t(v.dtype);
    h.rows = v.rows;
    h.cols = v.cols;
    h.block_rows = v.block_rows;
    h.block_cols = v.block_cols;
    h.data_bytes = uint64_t(v.bytes());
    h.scales = scale_count(v);
    std::memcpy(p + 8 + i * sizeof(MatrixHeader), &h, sizeof h);
    blob.parts.emplace_back(v.data, size_t(h.data_bytes));
    if (h.scales > 0) {
      blob.parts.emplace_back(reinterpret_cast<const uint8_t*>(v.scale_inv),
                              size_t(h.scales * sizeof(float)));
    }
  }
  struct Keep {
    std::shared_ptr<std::vector<uint8_t>> header;
    std::shared_ptr<const void> weights;
  };
  blob.keep = std::make_shared<Keep>(Keep{std::move(header), std::move(keep)});
  return blob;
}

Result<std::shared_ptr<const RuntimeExpert>> decode_expert(std::vector<uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes) {
    return Corrupt(fmt::format("expert bytes: {} bytes, shorter than the header", bytes.size()));
  }
  uint32_t magic = 0, n = 0;
  std::memcpy(&magic, bytes.data(), 4);
  std::memcpy(&n, bytes.data() + 4, 4);
  if (magic != kMagic || n != kMatrices) return Corrupt("expert bytes: not an expert (magic)");
  auto e = std::make_shared<RuntimeExpert>();
  size_t at = kHeaderBytes;
  MatrixHeader h[kMatrices];
  for (uint32_t i = 0; i < kMatrices; ++i) {
    std::memcpy(&h[i], bytes.data() + 8 + i * sizeof(MatrixHeader), sizeof(MatrixHeader));
    const MatrixHeader& m = h[i];
    if (!known_weight_dtype(m.dtype) || m.rows < 1 || m.cols < 1 || m.rows > (int64_t(1) << 24) ||
        m.cols > (int64_t(1) << 24)) {
      return Corrupt(fmt::format("expert bytes: matrix {}: bad dtype or shape", i));
    }
    WeightView& v = *const_cast<WeightView*>(matrix(e->weights, i));
    v.dtype = DType(m.dtype);
    v.rows = m.rows;
    v.cols = m.cols;
    v.block_rows = m.block_rows;
    v.block_cols = m.block_cols;
    if (v.block_scaled() && (m.block_rows < 1 || m.block_cols < 1)) {
      return Corrupt(fmt::format("expert bytes: matrix {}: bad scale blocks", i));
    }
    if (v.dtype == DType::kF4E2M1 && m.cols % 2 != 0) {
      return Corrupt(fmt::format("expert bytes: matrix {}: FP4 with an odd row", i));
    }
    if (m.data_bytes != uint64_t(v.bytes()) || m.scales != scale_count(v)) {
      return Corrupt(fmt::format("expert bytes: matrix {}: sizes disagree with its shape", i));
    }
    at += size_t(m.data_bytes + m.scales * sizeof(float));
  }
  if (at != bytes.size()) {
    return Corrupt(
        fmt::format("expert bytes: {} bytes, the header describes {}", bytes.size(), at));
  }
  e->bytes = std::move(bytes);
  at = kHeaderBytes;
  for (uint32_t i = 0; i < kMatrices; ++i) {
    WeightView& v = *const_cast<WeightView*>(matrix(e->weights, i));
    v.data = e->bytes.data() + at;
    at += size_t(h[i].data_bytes);
    if (h[i].scales > 0) {
      e->scales[i].resize(size_t(h[i].scales));  // aligned copy
      std::memcpy(e->scales[i].data(), e->bytes.data() + at, size_t(h[i].scales * sizeof(float)));
      v.scale_inv = e->scales[i].data();
      at += size_t(h[i].scales * sizeof(float));
    }
  }
  return std::shared_ptr<const RuntimeExpert>(std::move(e));
}

// ---- ExpertStore ----

ExpertStore::ExpertStore(const ModelConfig& config, const ModelWeights& weights,
                         PackedLinears* packed, WeightFormat format)
    : config_(config), weights_(weights), packed_(packed), format_(format) {}

const ExpertList* ExpertStore::moe_layer_experts(int64_t moe_layer) const {
  if (weights_.v4) {  // every layer routes (the MTP block's last)
    const auto& layers = weights_.v4->layers;
    if (moe_layer < 0 || moe_layer >= int64_t(layers.size())) return nullptr;
    return &layers[size_t(moe_layer)].experts;
  }
  int64_t m = 0;
  for (int64_t l = 0; l < int64_t(weights_.layers.size()); ++l) {  // (the MTP layer's last)
    if (!config_.is_moe_layer(l)) continue;
    if (m++ == moe_layer) {
      const auto& moe = weights_.layers[size_t(l)].moe;
      return moe ? &moe->experts : nullptr;
    }
  }
  return nullptr;
}

const MlpWeights* ExpertStore::held(const ExpertList& experts, int32_t expert) const {
  if (!runtime_.empty()) {
    auto it = runtime_.find({&experts, expert});
    if (it != runtime_.end()) return it->second ? &it->second->weights : nullptr;
  }
  const auto& e = experts[size_t(expert)];
  return e ? &*e : nullptr;
}

bool ExpertStore::has_expert(int64_t moe_layer, int32_t expert) const {
  const ExpertList* w = moe_layer_experts(moe_layer);
  return w && expert >= 0 && expert < config_.n_routed_experts && held(*w, expert);
}

bool ExpertStore::expert_received(int64_t moe_layer, int32_t expert) const {
  const ExpertList* w = moe_layer_experts(moe_layer);
  if (!w) return false;
  auto it = runtime_.find({w, expert});
  return it != runtime_.end() && it->second;
}

Result<ExpertBlob> ExpertStore::export_expert(int64_t moe_layer, int32_t expert) {
  const ExpertList* w = moe_layer_experts(moe_layer);
  const MlpWeights* e =
      w && expert >= 0 && expert < config_.n_routed_experts ? held(*w, expert) : nullptr;
  if (!e) {
    return NotFound(fmt::format("MoE layer {} expert {} is not on this rank", moe_layer, expert));
  }
  std::shared_ptr<const void> keep;
  if (auto it = runtime_.find({w, expert}); it != runtime_.end()) keep = it->second;
  return encode_expert(*e, std::move(keep));
}

Status ExpertStore::install_expert(int64_t moe_layer, int32_t expert, std::vector<uint8_t> bytes) {
  const ExpertList* w = moe_layer_experts(moe_layer);
  if (!w || expert < 0 || expert >= config_.n_routed_experts) {
    return InvalidArgument(
        fmt::format("no MoE layer {} expert {} in this model", moe_layer, expert));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const RuntimeExpert> e, decode_expert(std::move(bytes)));
  const int64_t H = config_.hidden_size, I = config_.moe_intermediate_size;
  const MlpWeights& m = e->weights;
  if (m.gate.rows != I || m.gate.cols != H || m.up.rows != I || m.up.cols != H ||
      m.down.rows != H || m.down.cols != I) {
    return InvalidArgument(
        fmt::format("MoE layer {} expert {}: shapes do not match the model", moe_layer, expert));
  }
  // The layer's experts run together (one grouped GEMM picks its path from the first): the
  // newcomer must have their dtype, in all three matrices.
  DType want = m.gate.dtype;
  for (int32_t other = 0; other < int32_t(config_.n_routed_experts); ++other) {
    const MlpWeights* o = other == expert ? nullptr : held(*w, other);
    if (o) {
      want = o->gate.dtype;
      break;
    }
  }
  if (m.gate.dtype != want || m.up.dtype != want || m.down.dtype != want) {
    return InvalidArgument(
        fmt::format("MoE layer {} expert {}: its dtype differs from the layer's other experts",
                    moe_layer, expert));
  }
  if (want == DType::kF4E2M1) {
    if (!config_.v4 || !config_.v4->fp4_experts) {
      return InvalidArgument(fmt::format(
          "MoE layer {} expert {}: FP4 weights for a model whose routed experts are not FP4",
          moe_layer, expert));
    }
    for (const WeightView* v : {&m.gate, &m.up, &m.down}) {
      if (v->block_rows != 1 || v->block_cols != 32) {
        return InvalidArgument(fmt::format(
            "MoE layer {} expert {}: FP4 weights need one scale per 1 x 32", moe_layer, expert));
      }
    }
  }
  std::vector<std::pair<const uint8_t*, PackedLinear>> packed;
  if (packed_) {
    for (const WeightView* v : {&m.gate, &m.up, &m.down}) {
      if (v->dtype != DType::kF8E4M3) continue;
      if (v->block_rows != 128 || v->block_cols != 128) {
        return InvalidArgument("gemm_fp8 needs 128x128 scale blocks");
      }
      packed.emplace_back(v->data, pack_linear(v->data, v->scale_inv, v->rows, v->cols, format_));
      release_file_pages(v->data, v->bytes());  // (nothing, unless it is the checkpoint's)
    }
  }
  if (packer_.pack) {
    const Status s = packer_.pack(m);
    if (!s.ok()) {
      packer_.forget(m);
      return InvalidArgument(
          fmt::format("MoE layer {} expert {}: {}", moe_layer, expert, s.message()));
    }
  }
  drop_expert(moe_layer, expert);
  for (auto& [key, p] : packed) (*packed_)[key] = std::move(p);
  runtime_[{w, expert}] = std::move(e);
  return Status::Ok();
}

void ExpertStore::drop_expert(int64_t moe_layer, int32_t expert) {
  const ExpertList* w = moe_layer_experts(moe_layer);
  if (!w || expert < 0 || expert >= config_.n_routed_experts) return;
  if (const MlpWeights* e = held(*w, expert); e) {
    if (packed_) {
      for (const WeightView* v : {&e->gate, &e->up, &e->down}) packed_->erase(v->data);
    }
    if (packer_.forget) packer_.forget(*e);
  }
  runtime_[{w, expert}] = nullptr;
}

// ---- ModelExpertHost ----

Result<ExpertBlob> ModelExpertHost::export_expert(int64_t moe_layer, int32_t expert) {
  return store_.export_expert(moe_layer, expert);
}

Status ModelExpertHost::install_expert(int64_t moe_layer, int32_t expert,
                                       std::vector<uint8_t> bytes) {
  return store_.install_expert(moe_layer, expert, std::move(bytes));
}

void ModelExpertHost::drop_expert(int64_t moe_layer, int32_t expert) {
  store_.drop_expert(moe_layer, expert);
}

}  // namespace moeserve
