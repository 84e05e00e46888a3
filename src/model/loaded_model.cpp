#include "model/loaded_model.h"

#include <fmt/format.h>

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
  int64_t num_blocks = 0;
  if (o.kv_blocks) {
    num_blocks = *o.kv_blocks;
    if (num_blocks < 1) return InvalidArgument("a KV cache needs at least one block");
  } else {
    const double bytes_per_block = double(layout.block_bytes());
    num_blocks = int64_t(o.kv_cache_gb * 1e9 / bytes_per_block);
    if (num_blocks < 1) {
      return InvalidArgument(fmt::format("--kv-cache-gb {} holds no KV block ({} bytes each)",
                                         o.kv_cache_gb, bytes_per_block));
    }
  }
  if (num_blocks > INT32_MAX) num_blocks = INT32_MAX;
  ASSIGN_OR_RETURN(uint64_t fingerprint,
                   model_fingerprint(o.model_dir, o.kv_dtype, o.compute, o.mtp,
                                     o.formats.projections, o.formats.experts));
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
  m->cache_ = std::make_unique<KvCache>(layout, int32_t(num_blocks), fingerprint);
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
