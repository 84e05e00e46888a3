// LoadedModel: one way to bring a model up (docs/engine.md, "Bringing a model up"). open()
// takes a checkpoint directory and the options every command shares, and returns what serving
// it needs, owned in one place and built in this order:
//
//   checkpoint (config.json, the safetensors weights, the MTP module when asked)
//     -> its family (model/family.h): supports(compute path), KV layout(kv dtype, mtp)
//     -> fingerprint (model/fingerprint.h: what decides the bits of a KV block)
//     -> thread pool, a local dispatcher (or the EP group's, borrowed)
//     -> the family's forward pass (weights prepared for the fast path, or mapped from the
//        weight cache)
//     -> the disk tier (when asked) -> the paged KV cache over it.
//
// `serve` and its router units (through make_engine), `generate`, `perplexity` and
// `moeserve-bench` all call it; ModelOptions holds the defaults, once. Errors name the model
// directory and what is wrong (an unsupported model_type lists the supported families).
//
// Not thread-safe: the caller's step thread uses the model and the cache.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "cache/disk_tier.h"
#include "cache/kv_cache.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "ep/dispatcher.h"
#include "model/causal_lm.h"
#include "model/checkpoint.h"
#include "model/family.h"

namespace moeserve {

struct ModelOptions {
  std::string model_dir;
  int threads = 0;  // compute threads (0: all cores)
  ComputePath compute = ComputePath::kFast;
  AttentionMode attention = AttentionMode::kAbsorbed;
  WeightFormats formats;  // the fast path's opt-in requantized weights (docs/quantization.md)
  std::string weight_cache_dir;  // prepared weights on disk (model/weight_cache.h); "": none
  // The KV cache's main format (kernels/kv_token.h): kBF16, kF8E4M3 (FlashMLA's FP8 with
  // scale: 656 bytes per token per layer for V3 against 1,152; needs kv_lora_rank % 128 == 0)
  // or kF32 (the reference path's).
  DType kv_dtype = DType::kBF16;
  double kv_cache_gb = 1.0;  // memory for the KV cache (kv_blocks, when set, instead)
  std::optional<int64_t> kv_blocks;
  // The window pool (a layout with sliding windows, V4: docs/kv-cache.md "The window pool"):
  // its pages. Unset: what kv_window_seqs sequences taking kv_window_tokens tokens a step need,
  // twice over (the rest keeps windows cached for prefix reuse), at most one page per block;
  // kv_window_seqs 0: one page per block. Sized by kv_cache_gb, the main pool gets the rest.
  std::optional<int64_t> kv_window_blocks;
  int64_t kv_window_seqs = 0;
  int64_t kv_window_tokens = 0;
  // The KV cache's disk tier (cache/disk_tier.h): a directory shared by any number of
  // processes; empty: none. kv_disk_gb bounds it (0: no bound).
  std::string kv_disk_dir;
  double kv_disk_gb = 0;
  // Also load the checkpoint's MTP module (docs/mtp.md); its layer gets a place in every KV
  // block. make_engine sets it from EngineOptions::speculative.
  bool mtp = false;
  bool overlap = true;              // EP: dual micro-batch overlap (docs/ep-overlap.md)
  int64_t overlap_min_tokens = -1;  // EP: CausalLm::set_overlap_min_tokens (-1: automatic)
  bool progress = false;            // loading and preparation progress on stderr
};

class LoadedModel {
 public:
  // `ep`: the EP group's dispatcher (borrowed; it decides which experts this rank loads), or
  // null for one process holding every expert.
  static Result<std::unique_ptr<LoadedModel>> open(const ModelOptions& options,
                                                   Dispatcher* ep = nullptr);
  ~LoadedModel();
  LoadedModel(const LoadedModel&) = delete;
  LoadedModel& operator=(const LoadedModel&) = delete;

  const ModelOptions& options() const { return options_; }
  const ModelFamily& family() const { return *family_; }
  const ModelConfig& config() const { return checkpoint_->config(); }
  const Checkpoint& checkpoint() const { return *checkpoint_; }
  uint64_t fingerprint() const { return fingerprint_; }
  ThreadPool& pool() { return pool_; }
  Dispatcher& dispatcher() { return ep_ ? *ep_ : local_dispatcher_; }
  CausalLm& model() { return *model_; }
  KvCache& cache() { return *cache_; }
  DiskTier* disk() { return disk_.get(); }  // null without kv_disk_dir

 private:
  LoadedModel(const ModelOptions& options, std::unique_ptr<Checkpoint> checkpoint,
              const ModelFamily& family, uint64_t fingerprint, Dispatcher* ep);

  ModelOptions options_;
  std::unique_ptr<Checkpoint> checkpoint_;
  const ModelFamily* family_;
  uint64_t fingerprint_;
  ThreadPool pool_;
  LocalDispatcher local_dispatcher_;
  Dispatcher* ep_;
  std::unique_ptr<CausalLm> model_;
  std::unique_ptr<DiskTier> disk_;  // outlives cache_, which borrows it
  std::unique_ptr<KvCache> cache_;
};

}  // namespace moeserve
