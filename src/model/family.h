// Model families (docs/engine.md, "Model families"): the architectures that share one forward
// pass and one KV layout, and the table that picks a checkpoint's family from its config.json.
//
// A family says which config.json `model_type` / `architectures` it runs, whether its forward
// pass can run a config on a compute path, what its layers keep per token in the paged KV cache
// (a KvLayout, one description per layer) and how its forward pass is built over the loaded
// weights. The bring-up (model/loaded_model.h) goes through it; nothing else names a family's
// class. Adding an architecture is one entry in the table of family.cpp plus its own files.
//
// The table is constant: any thread may read it.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/kv_cache.h"
#include "core/dtype.h"
#include "core/status.h"
#include "model/causal_lm.h"
#include "model/config.h"

namespace moeserve {

class Dispatcher;
class ThreadPool;
struct ModelWeights;
struct WeightCacheOptions;

// How a family's forward pass is built: the options of model/loaded_model.h that reach it.
struct ForwardOptions {
  ComputePath compute = ComputePath::kFast;
  AttentionMode attention = AttentionMode::kAbsorbed;
  WeightFormats formats;
  bool overlap = true;    // EP: dual micro-batch overlap
  bool progress = false;  // weight preparation progress on stderr
};

struct ModelFamily {
  std::string_view name;                        // "deepseek_v3"
  std::string_view models;                      // what users call the checkpoints it runs
  std::vector<std::string_view> model_types;    // config.json model_type values
  std::vector<std::string_view> architectures;  // config.json architectures[0] values
  // Ok when the family's forward pass runs `config` with `options` (its path, its requantized
  // formats); else InvalidArgument naming the config field or option that stops it.
  Status (*supports)(const ModelConfig& config, const ForwardOptions& options);
  // What each layer keeps per token in the paged KV cache with `kv_dtype` as its main format
  // (kv_layout_status says whether the family can use it); with mtp, the MTP module's layer
  // after the main ones.
  KvLayout (*kv_layout)(const ModelConfig& config, DType kv_dtype, bool mtp);
  // The forward pass over `weights` (borrowed, as are dispatcher, pool and config: they outlive
  // it). The family's supports() is ok for (config, options).
  std::unique_ptr<CausalLm> (*make)(const ModelConfig& config, const ModelWeights& weights,
                                    Dispatcher& dispatcher, ThreadPool* pool,
                                    const ForwardOptions& options,
                                    const WeightCacheOptions& weight_cache);
};

// Every family moeserve runs, in the order error messages list them.
std::span<const ModelFamily> model_families();

// The family whose model_types hold `model_type` (and, when `architectures` is not empty,
// whose architectures hold its first entry); InvalidArgument from `source` naming both and
// listing the supported families otherwise.
Result<const ModelFamily*> find_model_family(std::string_view model_type,
                                             std::span<const std::string> architectures,
                                             const std::string& source);
// The family of a parsed config (its model_type).
const ModelFamily& model_family(const ModelConfig& config);

// The KV layout of a config's family (ModelFamily::kv_layout).
KvLayout kv_cache_layout(const ModelConfig& config, DType kv_dtype, bool mtp = false);

}  // namespace moeserve
