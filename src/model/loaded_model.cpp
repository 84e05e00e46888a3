#include "model/loaded_model.h"

#include <string_view>

#include <fmt/format.h>
#include <xxhash.h>

#include "model/fingerprint.h"
#include "model/weight_cache.h"

namespace moeserve {

Result<std::unique_ptr<LoadedModel>> LoadedModel::open(const ModelOptions& o, Dispatcher* ep) {
  // The family first (config.json's model_type and architectures, checked against the family
  // table), before any weights are read.
  ASSIGN_OR_RETURN(ModelConfig config, load_model_config(o.model_dir + "/config.json"));
  const ModelFamily* family = &model_family(config);
  LoadOptions load;
  load.progress = o.progress;
  load.mtp = o.mtp;
  if (ep) {
    load.holds_layer_expert = [ep](int64_t moe_layer, int32_t e) {
      return ep->holds_layer_expert(moe_layer, e);
    };
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ck, Checkpoint::open(o.model_dir, load));
  const ModelConfig& c = ck->config();
  const ForwardOptions forward{o.compute, o.attention, o.formats, o.overlap, o.progress};
  RETURN_IF_ERROR(family->supports(c, forward).with_context(o.model_dir));
  const KvLayout layout = family->kv_layout(c, o.kv_dtype, o.mtp);
  RETURN_IF_ERROR(kv_layout_status(layout).with_context(o.model_dir));
  int64_t num_blocks = 0, window_pages = -1;
  const double main_bytes = double(layout.main_bytes()),
               window_bytes = double(layout.window_bytes());
  const int64_t k = layout.window_blocks();
  // The window pool's pages when none are asked for (-1: one per block).
  const int64_t auto_pages = o.kv_window_seqs > 0
                                 ? 2 * (o.kv_window_seqs * (k + 1) +
                                        blocks_for(std::max<int64_t>(1, o.kv_window_tokens))) +
                                       k + 1
                                 : -1;
  if (o.kv_blocks) {
    num_blocks = *o.kv_blocks;
    if (num_blocks < 1) return InvalidArgument("a KV cache needs at least one block");
    if (window_bytes > 0) {
      window_pages = o.kv_window_blocks.value_or(auto_pages);
      if (window_pages > num_blocks || window_pages < 0) window_pages = num_blocks;
    }
  } else if (window_bytes > 0 && (o.kv_window_blocks || auto_pages > 0)) {
    const double budget = o.kv_cache_gb * 1e9;
    window_pages = o.kv_window_blocks.value_or(auto_pages);
    // (Sized by default, the windows take at most half of the memory.)
    if (!o.kv_window_blocks) {
      window_pages = std::min<int64_t>(
          window_pages, std::max<int64_t>(k + 2, int64_t(budget / 2 / window_bytes)));
    }
    num_blocks = int64_t((budget - double(window_pages) * window_bytes) / main_bytes);
    if (num_blocks < 1) {
      return InvalidArgument(fmt::format(
          "--kv-cache-gb {} holds no KV block beside {} window pages ({} + {} bytes each)",
          o.kv_cache_gb, window_pages, main_bytes, window_bytes));
    }
    window_pages = std::min(window_pages, num_blocks);
  } else {
    const double bytes_per_block = double(layout.block_bytes());
    num_blocks = int64_t(o.kv_cache_gb * 1e9 / bytes_per_block);
    if (num_blocks < 1) {
      return InvalidArgument(fmt::format("--kv-cache-gb {} holds no KV block ({} bytes each)",
                                         o.kv_cache_gb, bytes_per_block));
    }
  }
  if (window_pages >= 0 && window_pages < num_blocks && window_pages < k + 2) {
    return InvalidArgument(fmt::format(
        "{}: a window pool of {} pages is too small: a sequence reads {} blocks' windows before "
        "its step and writes at least two (--kv-window-blocks >= {})",
        o.model_dir, window_pages, k, k + 2));
  }
  if (num_blocks > INT32_MAX) num_blocks = INT32_MAX;
  ASSIGN_OR_RETURN(uint64_t fingerprint,
                   model_fingerprint(o.model_dir, o.kv_dtype, o.compute, o.mtp,
                                     o.formats.projections, o.formats.experts));
  if (layout.window_bytes() > 0) {
    // Blocks with windows keep that region last (cache/kv_layout.h): other bytes than the blocks
    // of the same model written before that order, so another chain.
    constexpr std::string_view kWindowLast = "kv window region last";
    fingerprint = XXH3_64bits_withSeed(kWindowLast.data(), kWindowLast.size(), fingerprint);
  }
  std::unique_ptr<DiskTier> disk;  // before the weights are prepared (minutes for V3)
  if (!o.kv_disk_dir.empty()) {
    ASSIGN_OR_RETURN(
        disk, DiskTier::open({o.kv_disk_dir, o.kv_disk_gb}, fingerprint, layout.block_bytes()));
  }
  std::unique_ptr<LoadedModel> m(new LoadedModel(o, std::move(ck), *family, fingerprint, ep));
  if (ep && ep->world_size() > 1 && !m->model_->collective()) {
    return Unimplemented(fmt::format("{}: the {} family does not run as an EP group yet",
                                     o.model_dir, family->name));
  }
  if (o.mtp && !m->model_->has_mtp()) {
    return Unimplemented(fmt::format(
        "{}: the {} family does not run its MTP module yet (speculative decoding with mtp)",
        o.model_dir, family->name));
  }
  m->disk_ = std::move(disk);
  if (window_pages > INT32_MAX) window_pages = INT32_MAX;
  m->cache_ =
      std::make_unique<KvCache>(layout, int32_t(num_blocks), fingerprint, int32_t(window_pages));
  m->cache_->set_tier(m->disk_.get());
  return m;
}

LoadedModel::LoadedModel(const ModelOptions& o, std::unique_ptr<Checkpoint> checkpoint,
                         const ModelFamily& family, uint64_t fingerprint, Dispatcher* ep)
    : options_(o),
      checkpoint_(std::move(checkpoint)),
      family_(&family),
      fingerprint_(fingerprint),
      pool_(o.threads),
      local_dispatcher_(checkpoint_->config().n_routed_experts,
                        /*bf16_rows=*/o.compute == ComputePath::kFast),
      ep_(ep) {
  model_ = family.make(checkpoint_->config(), checkpoint_->weights(), dispatcher(), &pool_,
                       ForwardOptions{o.compute, o.attention, o.formats, o.overlap, o.progress},
                       WeightCacheOptions{o.weight_cache_dir, fingerprint});
  model_->set_overlap_min_tokens(o.overlap_min_tokens);
}

LoadedModel::~LoadedModel() = default;

}  // namespace moeserve
