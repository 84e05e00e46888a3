// Routed experts installed and dropped at run time (EPLB migration, docs/eplb.md "Online
// rebalancing"): the wire format of one routed expert, the owned form a received expert takes,
// and ModelExpertHost, the ep::ExpertHost of a DeepseekModel.
//
// Wire format of one expert (host byte order: the ranks of a group share one architecture):
//   header  u32 magic "MSX1", u32 matrices (3: gate, up, down), then per matrix
//           u32 dtype, u32 0, i64 rows, cols, block_rows, block_cols, u64 data bytes, u64 scales;
//   body    per matrix: its rows x cols weights as in the checkpoint (row-major; FP8 e4m3, BF16,
//           F16 or F32), then its F32 weight_scale_inv blocks (FP8 only, ceil(rows/block_rows) x
//           ceil(cols/block_cols)).
// The checkpoint's own format, not the fast path's packed tiles: every compute path reads it,
// and packing it on arrival costs about a copy (docs/eplb.md). encode_expert gives the bytes as
// spans into the weights (nothing copied); decode_expert validates everything it reads.
//
// DeepseekModel's install_expert/drop_expert/export_expert (defined in expert_store.cpp) use
// these; they must be called between two forward() calls, from the thread that calls forward().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "ep/expert_migration.h"
#include "model/checkpoint.h"

namespace moeserve {

class DeepseekModel;

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

// The ExpertHost of a model (borrowed: it must outlive the host).
class ModelExpertHost final : public ExpertHost {
 public:
  explicit ModelExpertHost(DeepseekModel& model) : model_(model) {}
  Result<ExpertBlob> export_expert(int64_t moe_layer, int32_t expert) override;
  Status install_expert(int64_t moe_layer, int32_t expert, std::vector<uint8_t> bytes) override;
  void drop_expert(int64_t moe_layer, int32_t expert) override;

 private:
  DeepseekModel& model_;
};

}  // namespace moeserve
