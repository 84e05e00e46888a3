// Routed experts installed and dropped at run time (EPLB migration, docs/eplb.md "Online
// rebalancing"): the wire format of one routed expert, the owned form a received expert takes,
// ExpertStore (which experts a rank holds now; the model asks it for an expert's weights and
// knows nothing of migration) and ModelExpertHost, the ep::ExpertHost over a model's store.
//
// Wire format of one expert (host byte order: the ranks of a group share one architecture):
//   header  u32 magic "MSX1", u32 matrices (3: gate, up, down), then per matrix
//           u32 dtype, u32 0, i64 rows, cols, block_rows, block_cols, u64 data bytes, u64 scales;
//   body    per matrix: its rows x cols weights as in the checkpoint (row-major; FP8 e4m3, FP4
//           e2m1 two a byte, BF16, F16 or F32), then its F32 scale blocks (FP8 and FP4 only,
//           ceil(rows/block_rows) x ceil(cols/block_cols); FP4's are DeepSeek-V4's UE8M0 powers
//           of two per 1 x 32).
// The checkpoint's own format, not the fast path's packed tiles: every compute path reads it,
// and packing it on arrival costs about a copy (docs/eplb.md). encode_expert gives the bytes as
// spans into the weights (nothing copied); decode_expert validates everything it reads.
//
// ExpertStore's install_expert/drop_expert/export_expert must be called between two forward()
// calls of its model, from the thread that calls forward().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "ep/expert_migration.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/packed_linear.h"

namespace moeserve {

// A received expert: the wire bytes (the weights' views point into them) and aligned copies of
// the scales. Immutable once built.
struct RuntimeExpert {
  std::vector<uint8_t> bytes;
  std::vector<float> scales[3];
  MlpWeights weights;
};

// The expert's bytes in the wire format; `keep` (may be null) is stored in the blob to keep the
// weights' memory alive.
ExpertBlob encode_expert(const MlpWeights& w, std::shared_ptr<const void> keep);
// Corrupt naming the problem when the bytes are not a well-formed expert.
Result<std::shared_ptr<const RuntimeExpert>> decode_expert(std::vector<uint8_t> bytes);

// A layer's routed experts as the checkpoint binds them (nullopt: not on this rank).
using ExpertList = std::vector<std::optional<MlpWeights>>;

// How a model whose fast path keeps its own packed copies (DeepSeek-V4's) packs an installed
// expert's matrices and forgets a dropped one's; pack's error names what cannot be packed.
struct ExpertPacker {
  std::function<Status(const MlpWeights&)> pack;
  std::function<void(const MlpWeights&)> forget;
};

// The routed experts a rank holds now: the checkpoint's, over which received experts are
// installed and held ones dropped. moe_layer counts MoE layers only (DeepSeek-V4: every layer,
// the MTP block's last). Borrows the config, the weights and the fast path's packed-weight map
// (null on the reference path) or packer, which install and drop keep in step.
class ExpertStore {
 public:
  // format: how installed experts are prepared (the model's routed experts' format).
  ExpertStore(const ModelConfig& config, const ModelWeights& weights, PackedLinears* packed,
              WeightFormat format = WeightFormat::kFp8);
  // For a model with its own packed copies (instead of a PackedLinears map).
  void set_packer(ExpertPacker packer) { packer_ = std::move(packer); }

  // The weights of expert e of the layer whose routed experts are `experts` (or whose MoE
  // weights are w), or null when not held.
  const MlpWeights* held(const ExpertList& experts, int32_t expert) const;
  const MlpWeights* held(const MoeWeights& w, int32_t expert) const {
    return held(w.experts, expert);
  }
  bool has_expert(int64_t moe_layer, int32_t expert) const;
  bool expert_received(int64_t moe_layer, int32_t expert) const;  // from install_expert

  // The bytes of a held expert (NotFound otherwise).
  Result<ExpertBlob> export_expert(int64_t moe_layer, int32_t expert);
  // Takes an expert in the wire format above (replacing any copy held); the error names what
  // is wrong with the bytes or why they do not fit the model.
  Status install_expert(int64_t moe_layer, int32_t expert, std::vector<uint8_t> bytes);
  // Releases a held expert (its packed weights; the checkpoint's mapping stays).
  void drop_expert(int64_t moe_layer, int32_t expert);

 private:
  const ExpertList* moe_layer_experts(int64_t moe_layer) const;

  const ModelConfig& config_;
  const ModelWeights& weights_;
  PackedLinears* packed_;
  WeightFormat format_;
  ExpertPacker packer_;
  // Installed experts (null: dropped), over the checkpoint's.
  std::map<std::pair<const ExpertList*, int32_t>, std::shared_ptr<const RuntimeExpert>> runtime_;
};

// The ExpertHost of a model's store (borrowed: it must outlive the host).
class ModelExpertHost final : public ExpertHost {
 public:
  explicit ModelExpertHost(ExpertStore& store) : store_(store) {}
  Result<ExpertBlob> export_expert(int64_t moe_layer, int32_t expert) override;
  Status install_expert(int64_t moe_layer, int32_t expert, std::vector<uint8_t> bytes) override;
  void drop_expert(int64_t moe_layer, int32_t expert) override;

 private:
  ExpertStore& store_;
};

}  // namespace moeserve
