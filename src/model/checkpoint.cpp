#include "model/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "model/checkpoint_binder.h"
#include "model/deepseek_v4_weights.h"

namespace moeserve {

namespace fs = std::filesystem;

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir,
                                                     const LoadOptions& options) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  if (!fs::is_directory(dir)) return NotFound(dir + ": not a directory");
  ASSIGN_OR_RETURN(ck->config_, load_model_config((fs::path(dir) / "config.json").string()));
  const ModelConfig& c = ck->config_;
  if (options.mtp && c.num_nextn_predict_layers < 1) {
    return InvalidArgument(fmt::format(
        "{}/config.json: num_nextn_predict_layers is {}: the checkpoint has no MTP module "
        "(--speculative mtp needs one)",
        dir, c.num_nextn_predict_layers));
  }

  // Shard list: from the index when there is one, else the single file.
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> index_map;  // tensor -> shard file
  fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    auto j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
      return Corrupt(index_path.string() + ": not a JSON object with a 'weight_map' object");
    }
    std::set<std::string> seen;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) {
        return Corrupt(
            fmt::format("{}: weight_map['{}'] is not a file name", index_path.string(), name));
      }
      std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f == ".." || f.empty()) {
        return Corrupt(fmt::format("{}: weight_map['{}'] names '{}', not a file in the directory",
                                   index_path.string(), name, f));
      }
      index_map[name] = f;
      if (seen.insert(f).second) shard_names.push_back(f);
    }
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    return NotFound(dir + ": neither model.safetensors.index.json nor model.safetensors exists");
  }
  std::sort(shard_names.begin(), shard_names.end());

  ck->files_.reserve(shard_names.size());
  for (size_t i = 0; i < shard_names.size(); ++i) {
    if (options.progress) {
      std::fprintf(stderr, "\rloading %s: shard %zu/%zu", dir.c_str(), i + 1, shard_names.size());
      std::fflush(stderr);
    }
    ASSIGN_OR_RETURN(SafetensorsFile f,
                     SafetensorsFile::open((fs::path(dir) / shard_names[i]).string()));
    ck->files_.push_back(std::move(f));
  }
  if (options.progress) std::fprintf(stderr, "\n");
  for (const auto& [name, file] : index_map) {
    bool found = false;
    for (const auto& f : ck->files_) {
      if (fs::path(f.path()).filename() == file) found = f.find(name) != nullptr;
    }
    if (!found) {
      return Corrupt(
          fmt::format("{}: the index places tensor '{}' in {}, which does not contain it",
                      index_path.string(), name, file));
    }
  }

  CheckpointBinder b(c, dir, &ck->aligned_copies_);
  for (const auto& f : ck->files_) b.add_file(f);
  ModelWeights& w = ck->weights_;
  if (c.v4) {  // DeepSeek-V4's own names
    auto v4 = std::make_shared<V4Weights>();
    RETURN_IF_ERROR(bind_v4_weights(b, c, options, v4.get()));
    RETURN_IF_ERROR(b.check_all_used());
    w.v4 = std::move(v4);
    ck->weight_bytes_ = b.bytes();
    return ck;
  }
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  ASSIGN_OR_RETURN(w.embed, b.matrix("model.embed_tokens.weight", c.vocab_size, H));
  // The main layers, then (when asked for) the MTP module's decoder layer after them.
  const int64_t n_layers = c.num_hidden_layers + (options.mtp ? 1 : 0);
  w.layers.resize(size_t(n_layers));
  int64_t moe_layer = 0;  // index among MoE layers
  for (int64_t l = 0; l < n_layers; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights& L = w.layers[size_t(l)];
    ASSIGN_OR_RETURN(L.attn_norm, b.vector(p + "input_layernorm.weight", H));
    ASSIGN_OR_RETURN(L.ffn_norm, b.vector(p + "post_attention_layernorm.weight", H));
    AttentionWeights& A = L.attn;
    std::string a = p + "self_attn.";
    if (c.q_lora_rank) {
      ASSIGN_OR_RETURN(A.q_a, b.matrix(a + "q_a_proj.weight", *c.q_lora_rank, H));
      ASSIGN_OR_RETURN(A.q_a_norm, b.vector(a + "q_a_layernorm.weight", *c.q_lora_rank));
      ASSIGN_OR_RETURN(A.q_b,
                       b.matrix(a + "q_b_proj.weight", nh * c.qk_head_dim(), *c.q_lora_rank));
    } else {
      ASSIGN_OR_RETURN(A.q_b, b.matrix(a + "q_proj.weight", nh * c.qk_head_dim(), H));
    }
    ASSIGN_OR_RETURN(A.kv_a, b.matrix(a + "kv_a_proj_with_mqa.weight", c.kv_cache_dim(), H));
    ASSIGN_OR_RETURN(A.kv_a_norm, b.vector(a + "kv_a_layernorm.weight", c.kv_lora_rank));
    ASSIGN_OR_RETURN(A.kv_b, b.matrix(a + "kv_b_proj.weight",
                                      nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank));
    ASSIGN_OR_RETURN(A.o, b.matrix(a + "o_proj.weight", H, nh * c.v_head_dim));
    if (c.indexer) {
      const std::string ix = a + "indexer.";
      const int64_t d = c.indexer->head_dim;
      IndexerWeights& I = A.indexer.emplace();
      ASSIGN_OR_RETURN(I.wq_b,
                       b.matrix(ix + "wq_b.weight", c.indexer->n_heads * d, *c.q_lora_rank));
      ASSIGN_OR_RETURN(I.wk, b.matrix(ix + "wk.weight", d, H));
      ASSIGN_OR_RETURN(I.k_norm, b.vector(ix + "k_norm.weight", d));
      ASSIGN_OR_RETURN(I.k_bias, b.vector(ix + "k_norm.bias", d));
      ASSIGN_OR_RETURN(I.weights_proj, b.matrix(ix + "weights_proj.weight", c.indexer->n_heads, H));
    }
    if (!c.is_moe_layer(l)) {
      ASSIGN_OR_RETURN(L.mlp, b.mlp(p + "mlp", H, c.intermediate_size));
      continue;
    }
    MoeWeights m;
    ASSIGN_OR_RETURN(m.gate, b.matrix(p + "mlp.gate.weight", c.n_routed_experts, H));
    if (c.topk_method == TopkMethod::kNoauxTc) {
      ASSIGN_OR_RETURN(m.score_bias,
                       b.vector(p + "mlp.gate.e_score_correction_bias", c.n_routed_experts));
    }
    m.experts.resize(size_t(c.n_routed_experts));
    for (int32_t e = 0; e < int32_t(c.n_routed_experts); ++e) {
      std::string ep = fmt::format("{}mlp.experts.{}", p, e);
      const bool held = options.holds_layer_expert ? options.holds_layer_expert(moe_layer, e)
                        : options.holds_expert     ? options.holds_expert(e)
                                                   : true;
      if (!held) {
        b.skip_prefix(ep + ".");
        continue;
      }
      ASSIGN_OR_RETURN(m.experts[size_t(e)], b.mlp(ep, H, c.moe_intermediate_size));
    }
    if (c.n_shared_experts > 0) {
      ASSIGN_OR_RETURN(m.shared, b.mlp(p + "mlp.shared_experts", H,
                                       c.moe_intermediate_size * c.n_shared_experts));
    }
    L.moe = std::move(m);
    ++moe_layer;
  }
  if (options.mtp) {
    // The MTP module's own tensors; its embed_tokens and shared_head.head are copies of the main
    // model's (README_WEIGHTS.md: "shares parameters"), which it uses instead (docs/mtp.md).
    std::string p = fmt::format("model.layers.{}.", c.num_hidden_layers);
    MtpWeights m;
    ASSIGN_OR_RETURN(m.enorm, b.vector(p + "enorm.weight", H));
    ASSIGN_OR_RETURN(m.hnorm, b.vector(p + "hnorm.weight", H));
    ASSIGN_OR_RETURN(m.eh_proj, b.matrix(p + "eh_proj.weight", H, 2 * H));
    ASSIGN_OR_RETURN(m.head_norm, b.vector(p + "shared_head.norm.weight", H));
    b.skip_prefix(p + "embed_tokens.");
    b.skip_prefix(p + "shared_head.head.");
    w.mtp = std::move(m);
  }
  ASSIGN_OR_RETURN(w.norm, b.vector("model.norm.weight", H));
  if (c.tie_word_embeddings && !b.has("lm_head.weight")) {
    w.lm_head = w.embed;
  } else {
    ASSIGN_OR_RETURN(w.lm_head, b.matrix("lm_head.weight", c.vocab_size, H));
  }
  RETURN_IF_ERROR(b.check_all_used());
  ck->weight_bytes_ = b.bytes();
  return ck;
}

}  // namespace moeserve
