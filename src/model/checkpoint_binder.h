// CheckpointBinder: looks a checkpoint's tensors up by name across its shards, checks them
// against the config, and records which names were used so that leftovers can be reported.
// Internal to model/: Checkpoint::open and each family's binding of its tensor names use it.
#pragma once

#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/status.h"
#include "kernels/weight_view.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace moeserve {

namespace checkpoint_detail {

struct Located {
  const SafetensorsFile* file;
  const TensorInfo* info;
};

inline std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Layer index of "model.layers.<i>.<rest>", if the name has that form.
inline std::optional<int64_t> layer_of(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  size_t end = name.find('.', prefix.size());
  if (end == std::string::npos) return std::nullopt;
  try {
    return std::stoll(name.substr(prefix.size(), end - prefix.size()));
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace checkpoint_detail

using checkpoint_detail::ceil_div;
using checkpoint_detail::layer_of;
using checkpoint_detail::Located;
using checkpoint_detail::shape_str;

// Looks tensors up by name across shards, checks them against the config, and records which
// names were used so leftovers can be reported.
class CheckpointBinder {
 public:
  CheckpointBinder(const ModelConfig& config, const std::string& dir,
                   std::deque<std::vector<float>>* copies)
      : config_(config), dir_(dir), copies_(copies) {}

  void add_file(const SafetensorsFile& f) {
    for (const auto& [name, info] : f.tensors()) {
      if (!where_.count(name)) where_[name] = {&f, &info};
    }
  }
  bool has(const std::string& name) const { return where_.count(name) > 0; }

  Result<const TensorInfo*> find(const std::string& name) {
    auto it = where_.find(name);
    if (it == where_.end()) {
      return NotFound(fmt::format("{}: tensor '{}' is missing from the checkpoint", dir_, name));
    }
    used_.insert(name);
    return it->second.info;
  }
  std::string file_of(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? dir_ : it->second.file->path();
  }
  Status shape_error(const std::string& name, const TensorInfo& t, const std::string& want) {
    return InvalidArgument(fmt::format("{}: tensor '{}': {} {} but the config needs {}",
                                       file_of(name), name, dtype_name(t.dtype), shape_str(t.shape),
                                       want));
  }

  // A 2-D projection [rows, cols]: FP8 with weight_scale_inv, or a float dtype.
  Result<WeightView> matrix(const std::string& name, int64_t rows, int64_t cols) {
    ASSIGN_OR_RETURN(const TensorInfo* t, find(name));
    if (t->shape != std::vector<int64_t>{rows, cols}) {
      return shape_error(name, *t, shape_str({rows, cols}));
    }
    WeightView v;
    v.dtype = t->dtype;
    v.data = t->data;
    v.rows = rows;
    v.cols = cols;
    bytes_ += t->nbytes;
    if (t->dtype == DType::kF8E4M3) {
      if (!config_.quant) {
        return InvalidArgument(
            fmt::format("{}: tensor '{}' is F8_E4M3 but config.json has no quantization_config",
                        file_of(name), name));
      }
      v.block_rows = config_.quant->block_n;
      v.block_cols = config_.quant->block_k;
      if (config_.quant->ue8m0) {  // DeepSeek-V4: '<name>.scale', F8_E8M0
        ASSIGN_OR_RETURN(v.scale_inv, ue8m0_scales(name, ceil_div(rows, v.block_rows),
                                                   ceil_div(cols, v.block_cols), "F8_E4M3"));
        return v;
      }
      std::string sname = name + "_scale_inv";
      if (!has(sname)) {
        return NotFound(fmt::format("{}: tensor '{}' is F8_E4M3 but '{}' is missing", file_of(name),
                                    name, sname));
      }
      ASSIGN_OR_RETURN(const TensorInfo* s, find(sname));
      std::vector<int64_t> want = {ceil_div(rows, v.block_rows), ceil_div(cols, v.block_cols)};
      if (s->dtype != DType::kF32 || s->shape != want) {
        return shape_error(sname, *s, "F32 " + shape_str(want));
      }
      if (uintptr_t(s->data) % alignof(float) == 0) {
        v.scale_inv = reinterpret_cast<const float*>(s->data);
      } else {  // a writer that did not align its F32 data: keep an aligned copy
        copies_->emplace_back(size_t(s->nbytes / 4));
        std::memcpy(copies_->back().data(), s->data, s->nbytes);
        v.scale_inv = copies_->back().data();
      }
      bytes_ += s->nbytes;
    } else if (t->dtype != DType::kBF16 && t->dtype != DType::kF32 && t->dtype != DType::kF16) {
      return shape_error(name, *t, "a float type (F8_E4M3, BF16, F16, F32)");
    }
    return v;
  }

  // FP4 e2m1 [rows, cols] stored as I8 [rows, cols / 2] (two values a byte) with F8_E8M0
  // scales [rows, cols / 32] in '<name without .weight>.scale' (DeepSeek-V4's routed experts).
  Result<WeightView> fp4_matrix(const std::string& name, int64_t rows, int64_t cols) {
    ASSIGN_OR_RETURN(const TensorInfo* t, find(name));
    if (t->dtype != DType::kI8 || t->shape != std::vector<int64_t>{rows, cols / 2} || cols % 32) {
      return shape_error(name, *t, "I8 (FP4 e2m1 pairs) " + shape_str({rows, cols / 2}));
    }
    WeightView v;
    v.dtype = DType::kF4E2M1;
    v.data = t->data;
    v.rows = rows;
    v.cols = cols;
    v.block_rows = 1;
    v.block_cols = 32;
    bytes_ += t->nbytes;
    ASSIGN_OR_RETURN(v.scale_inv, ue8m0_scales(name, rows, cols / 32, "FP4"));
    return v;
  }

  // Any float tensor of exactly `shape`, converted to float (row-major).
  Result<std::vector<float>> floats(const std::string& name, const std::vector<int64_t>& shape) {
    ASSIGN_OR_RETURN(const TensorInfo* t, find(name));
    if (t->shape != shape ||
        (t->dtype != DType::kBF16 && t->dtype != DType::kF32 && t->dtype != DType::kF16)) {
      return shape_error(name, *t, "BF16/F16/F32 " + shape_str(shape));
    }
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    WeightView v{t->dtype, t->data, 1, n};
    std::vector<float> out(static_cast<size_t>(n));
    v.row_to_f32(0, out.data());
    bytes_ += t->nbytes;
    return out;
  }

  // An integer tensor of exactly `shape` (I64 or I32) as int32 values in [0, bound).
  Result<std::vector<int32_t>> ids(const std::string& name, const std::vector<int64_t>& shape,
                                   int64_t bound) {
    ASSIGN_OR_RETURN(const TensorInfo* t, find(name));
    if (t->shape != shape || (t->dtype != DType::kI64 && t->dtype != DType::kI32)) {
      return shape_error(name, *t, "I64/I32 " + shape_str(shape));
    }
    const size_t n = size_t(t->nbytes / dtype_size(t->dtype));
    std::vector<int32_t> out(n);
    for (size_t i = 0; i < n; ++i) {
      int64_t x = 0;
      if (t->dtype == DType::kI64) {
        std::memcpy(&x, t->data + 8 * i, 8);
      } else {
        int32_t y = 0;
        std::memcpy(&y, t->data + 4 * i, 4);
        x = y;
      }
      if (x < 0 || x >= bound) {
        return InvalidArgument(
            fmt::format("{}: tensor '{}' holds {} at {}; values must be in [0, {})", file_of(name),
                        name, x, i, bound));
      }
      out[i] = int32_t(x);
    }
    bytes_ += t->nbytes;
    return out;
  }

  // A 1-D float vector [n], converted to float.
  Result<std::vector<float>> vector(const std::string& name, int64_t n) {
    ASSIGN_OR_RETURN(const TensorInfo* t, find(name));
    if (t->shape != std::vector<int64_t>{n} ||
        (t->dtype != DType::kBF16 && t->dtype != DType::kF32 && t->dtype != DType::kF16)) {
      return shape_error(name, *t, "BF16/F16/F32 " + shape_str({n}));
    }
    WeightView v{t->dtype, t->data, 1, n};
    std::vector<float> out(static_cast<size_t>(n));
    v.row_to_f32(0, out.data());
    bytes_ += t->nbytes;
    return out;
  }

  Result<MlpWeights> mlp(const std::string& prefix, int64_t hidden, int64_t inter) {
    MlpWeights m;
    ASSIGN_OR_RETURN(m.gate, matrix(prefix + ".gate_proj.weight", inter, hidden));
    ASSIGN_OR_RETURN(m.up, matrix(prefix + ".up_proj.weight", inter, hidden));
    ASSIGN_OR_RETURN(m.down, matrix(prefix + ".down_proj.weight", hidden, inter));
    return m;
  }

  // Marks every tensor under prefix as deliberately skipped.
  void skip_prefix(const std::string& prefix) {
    for (auto it = where_.lower_bound(prefix); it != where_.end(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) != 0) break;
      used_.insert(it->first);
    }
  }

  Status check_all_used() const {
    std::vector<std::string> extra;
    for (const auto& [name, loc] : where_) {
      if (used_.count(name)) continue;
      if (name.size() >= 20 && name.compare(name.size() - 20, 20, "rotary_emb.inv_freq") == 0) {
        continue;
      }
      std::optional<int64_t> layer = layer_of(name);
      if (layer && *layer >= config_.num_hidden_layers &&
          *layer < config_.num_hidden_layers + config_.num_nextn_predict_layers) {
        continue;  // MTP modules not asked for (LoadOptions::mtp), or past the first
      }
      extra.push_back(fmt::format("'{}' (in {})", name,
                                  std::filesystem::path(loc.file->path()).filename().string()));
    }
    if (extra.empty()) return Status::Ok();
    size_t shown = std::min<size_t>(extra.size(), 8);
    return InvalidArgument(fmt::format("{}: {} unexpected tensor(s) for this config: {}{}", dir_,
                                       extra.size(),
                                       fmt::join(extra.begin(), extra.begin() + long(shown), ", "),
                                       extra.size() > shown ? ", ..." : ""));
  }

  size_t bytes() const { return bytes_; }

 private:
  // The F8_E8M0 block scales of a quantized weight `name` ("<stem>.weight" -> "<stem>.scale"),
  // [rows, cols], as F32 powers of two kept in the checkpoint's copies.
  Result<const float*> ue8m0_scales(const std::string& name, int64_t rows, int64_t cols,
                                    const char* what) {
    const std::string stem = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0
                                 ? name.substr(0, name.size() - 7)
                                 : name;
    const std::string sname = stem + ".scale";
    if (!has(sname)) {
      return NotFound(fmt::format("{}: tensor '{}' is {} but '{}' is missing", file_of(name), name,
                                  what, sname));
    }
    ASSIGN_OR_RETURN(const TensorInfo* s, find(sname));
    if (s->dtype != DType::kF8E8M0 || s->shape != std::vector<int64_t>{rows, cols}) {
      return shape_error(sname, *s, "F8_E8M0 " + shape_str({rows, cols}));
    }
    copies_->emplace_back(size_t(rows * cols));
    std::vector<float>& f = copies_->back();
    for (size_t i = 0; i < f.size(); ++i) {
      if (s->data[i] == 0xff) {  // UE8M0's NaN: no scale
        return Corrupt(fmt::format("{}: tensor '{}' holds the UE8M0 NaN (0xff) at element {}",
                                   file_of(sname), sname, i));
      }
      f[i] = f8e8m0_to_f32(s->data[i]);
    }
    bytes_ += s->nbytes;
    return f.data();
  }

 public:
 private:
  const ModelConfig& config_;
  std::string dir_;
  std::deque<std::vector<float>>* copies_;
  std::map<std::string, Located> where_;
  std::set<std::string> used_;
  size_t bytes_ = 0;
};

}  // namespace moeserve
