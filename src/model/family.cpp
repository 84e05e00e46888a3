#include "model/family.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/check.h"
#include "model/deepseek.h"
#include "model/deepseek_v4.h"

namespace moeserve {

namespace {

std::unique_ptr<CausalLm> make_deepseek(const ModelConfig& config, const ModelWeights& weights,
                                        Dispatcher& dispatcher, ThreadPool* pool,
                                        const ForwardOptions& o,
                                        const WeightCacheOptions& weight_cache) {
  return std::make_unique<DeepseekModel>(config, weights, dispatcher, pool, o.attention, o.compute,
                                         o.overlap, o.progress, o.formats, weight_cache);
}

Status v3_supports(const ModelConfig& config, const ForwardOptions& o) {
  return DeepseekModel::supports(config, o.compute);
}

// V4's experts are FP4 as published: --expert-dtype takes them to INT8 or INT4 (for the
// integer kernels, AMX's tiles among them), never to FP8; the other options are V3's
// (docs/deepseek-v4.md "Requantized weights").
Status v4_supports(const ModelConfig&, const ForwardOptions& o) {
  if (o.formats.experts == WeightFormat::kFp8) {
    return InvalidArgument(
        "--expert-dtype fp8: DeepSeek-V4's routed experts are FP4 as published; --expert-dtype "
        "takes int8 or int4 for them (docs/deepseek-v4.md)");
  }
  return Status::Ok();
}

std::unique_ptr<CausalLm> make_v4(const ModelConfig& config, const ModelWeights& weights,
                                  Dispatcher& dispatcher, ThreadPool* pool, const ForwardOptions& o,
                                  const WeightCacheOptions& weight_cache) {
  return make_deepseek_v4(config, weights, pool, o.compute == ComputePath::kFast, weight_cache,
                          &dispatcher, o.formats);
}

// The table. V2 and V3 share MLA, the MoE layer and the checkpoint's tensor names; they differ
// only in config fields (topk_method, scoring_func, q_lora_rank), which the forward pass reads.
const std::vector<ModelFamily>& families() {
  static const std::vector<ModelFamily> table = {
      {.name = "deepseek_v3",
       .models = "DeepSeek-V3, R1, V3.1, V2, V2-Lite (MLA, MoE)",
       .model_types = {"deepseek_v3", "deepseek_v2"},
       .architectures = {"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"},
       .supports = &v3_supports,
       .kv_layout = &DeepseekModel::kv_layout,
       .make = &make_deepseek},
      // V3.1 with DeepSeek Sparse Attention: the same forward pass with the lightning indexer
      // in every layer (config.indexer), and its FP8 keys in every layer's KV.
      {.name = "deepseek_v32",
       .models = "DeepSeek-V3.2-Exp, V3.2, V3.2-Speciale (MLA with sparse attention, MoE)",
       .model_types = {"deepseek_v32"},
       .architectures = {"DeepseekV32ForCausalLM"},
       .supports = &v3_supports,
       .kv_layout = &DeepseekModel::kv_layout,
       .make = &make_deepseek},
      // Per-layer sliding-window, compressed sparse and heavily compressed attention over one
      // shared KV head, multi-stream residuals, hash-routed and FP4 experts: its own forward pass
      // and tensor names (model/deepseek_v4.h).
      {.name = "deepseek_v4",
       .models = "DeepSeek-V4-Flash, V4-Pro (compressed sparse attention, mHC, MoE)",
       .model_types = {"deepseek_v4"},
       .architectures = {"DeepseekV4ForCausalLM"},
       .supports = &v4_supports,
       .kv_layout = &v4_kv_layout,
       .make = &make_v4},
  };
  return table;
}

bool contains(const std::vector<std::string_view>& v, std::string_view x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::string supported_list() {
  std::string s;
  for (const ModelFamily& f : families()) {
    if (!s.empty()) s += "; ";
    s += fmt::format("{} (model_type {}: {})", f.name, fmt::join(f.model_types, " or "), f.models);
  }
  return s;
}

}  // namespace

std::span<const ModelFamily> model_families() {
  return families();
}

Result<const ModelFamily*> find_model_family(std::string_view model_type,
                                             std::span<const std::string> architectures,
                                             const std::string& source) {
  for (const ModelFamily& f : families()) {
    if (!contains(f.model_types, model_type)) continue;
    if (!architectures.empty() && !contains(f.architectures, architectures.front())) {
      return InvalidArgument(fmt::format(
          "{}: field 'architectures' is '{}', which the {} family does not run (it runs {}) for "
          "model_type '{}'",
          source, architectures.front(), f.name, fmt::join(f.architectures, ", "), model_type));
    }
    return &f;
  }
  const std::string arch =
      architectures.empty() ? "" : fmt::format(", architectures '{}'", architectures.front());
  return InvalidArgument(
      fmt::format("{}: field 'model_type' is '{}'{}: no model family runs it; "
                  "supported: {}",
                  source, model_type, arch, supported_list()));
}

const ModelFamily& model_family(const ModelConfig& config) {
  for (const ModelFamily& f : families()) {
    if (contains(f.model_types, config.model_type)) return f;
  }
  CHECK(false, "a parsed config has a supported model_type");
  return families().front();
}

KvLayout kv_cache_layout(const ModelConfig& config, DType kv_dtype, bool mtp) {
  return model_family(config).kv_layout(config, kv_dtype, mtp);
}

}  // namespace moeserve
