#include "sim/model_spec.h"

#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace moeserve::sim {

Result<ModelSpec> model_preset(const std::string& name) {
  ModelSpec m;
  m.name = name;
  if (name == "deepseek-v3" || name == "deepseek-r1") {
    // config.json of deepseek-ai/DeepSeek-V3 (identical architecture for V3-0324 and R1).
    m.hidden = 7168;
    m.layers = 61;
    m.first_dense_layers = 3;
    m.dense_intermediate = 18432;
    m.moe_intermediate = 2048;
    m.routed_experts = 256;
    m.shared_experts = 1;
    m.experts_per_token = 8;
    m.vocab = 129280;
    m.heads = 128;
    m.q_lora_rank = 1536;
    m.kv_lora_rank = 512;
    m.qk_nope_dim = 128;
    m.qk_rope_dim = 64;
    m.v_head_dim = 128;
    m.mtp_layers = 1;
  } else if (name == "deepseek-v2-lite") {
    // config.json of deepseek-ai/DeepSeek-V2-Lite.
    m.hidden = 2048;
    m.layers = 27;
    m.first_dense_layers = 1;
    m.dense_intermediate = 10944;
    m.moe_intermediate = 1408;
    m.routed_experts = 64;
    m.shared_experts = 2;
    m.experts_per_token = 6;
    m.vocab = 102400;
    m.heads = 16;
    m.q_lora_rank = 0;
    m.kv_lora_rank = 512;
    m.qk_nope_dim = 128;
    m.qk_rope_dim = 64;
    m.v_head_dim = 128;
    m.mtp_layers = 0;
  } else if (name == "deepseek-v4-flash" || name == "deepseek-v4-pro") {
    // config.json of deepseek-ai/DeepSeek-V4-Flash / -Pro as DeepSeek publishes it
    // (docs/deepseek-v4.md).
    const bool pro = name == "deepseek-v4-pro";
    m.attention = AttentionKind::kV4;
    m.hidden = pro ? 7168 : 4096;
    m.layers = pro ? 61 : 43;
    m.first_dense_layers = 0;  // every V4 layer is MoE
    m.moe_intermediate = pro ? 3072 : 2048;
    m.routed_experts = pro ? 384 : 256;
    m.shared_experts = 1;
    m.experts_per_token = 6;
    m.vocab = 129280;
    m.heads = pro ? 128 : 64;
    m.q_lora_rank = pro ? 1536 : 1024;
    m.qk_rope_dim = 64;
    m.mtp_layers = 1;
    m.routed_weight_bytes = 0.5 + 1.0 / 32;  // expert_dtype fp4
    m.head_dim = 512;
    m.kv_heads = 1;
    m.o_groups = pro ? 16 : 8;
    m.o_lora_rank = 1024;
    m.sliding_window = 128;
    // compress_ratios: Flash [0, 0, (4, 128) x 20, 4, 0]; Pro [128, 128, (4, 128) x 29, 4, 0].
    m.sliding_layers = pro ? 0 : 2;
    m.csa_layers = pro ? 30 : 21;
    m.hca_layers = pro ? 31 : 20;
    m.mtp_compress_ratio = 0;
    m.index_heads = 64;
    m.index_head_dim = 128;
    m.index_topk = pro ? 1024 : 512;
    m.hc_mult = 4;
    m.hash_layers = 3;
  } else {
    return InvalidArgument(
        fmt::format("unknown model preset '{}' (known: deepseek-v3, deepseek-r1, deepseek-v2-lite, "
                    "deepseek-v4-flash, deepseek-v4-pro; or give the path of a config.json)",
                    name));
  }
  return m;
}

namespace {

Status read_int(const nlohmann::json& j, const char* key, bool required, int* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return InvalidArgument(fmt::format("config.json: missing '{}'", key));
    return Status::Ok();
  }
  if (!it->is_number_integer()) {
    return InvalidArgument(fmt::format("config.json: '{}' must be an integer", key));
  }
  *out = it->get<int>();
  return Status::Ok();
}

// Counts a V4 layer's compress ratio into the spec (0 window only, csa_ratio, hca_ratio).
Status count_ratio(int ratio, ModelSpec* m) {
  if (ratio == 0) {
    ++m->sliding_layers;
  } else if (ratio == m->csa_ratio) {
    ++m->csa_layers;
  } else if (ratio == m->hca_ratio) {
    ++m->hca_layers;
  } else {
    return InvalidArgument(
        fmt::format("config.json: compress ratio {} (the cost model knows 0, {} and {})", ratio,
                    m->csa_ratio, m->hca_ratio));
  }
  return Status::Ok();
}

// DeepSeek-V4's config.json as the hub ships it (compress_ratios with the MTP layer's last), or
// as transformers writes it (layer_types, compress_rates).
Result<ModelSpec> v4_from_hf_config(const nlohmann::json& j, const std::string& name) {
  ModelSpec m;
  m.name = name;
  m.attention = AttentionKind::kV4;
  m.hc_mult = 4;
  RETURN_IF_ERROR(read_int(j, "hidden_size", true, &m.hidden));
  RETURN_IF_ERROR(read_int(j, "num_hidden_layers", true, &m.layers));
  RETURN_IF_ERROR(read_int(j, "moe_intermediate_size", true, &m.moe_intermediate));
  RETURN_IF_ERROR(read_int(j, "n_routed_experts", true, &m.routed_experts));
  RETURN_IF_ERROR(read_int(j, "n_shared_experts", false, &m.shared_experts));
  RETURN_IF_ERROR(read_int(j, "num_experts_per_tok", true, &m.experts_per_token));
  RETURN_IF_ERROR(read_int(j, "vocab_size", true, &m.vocab));
  RETURN_IF_ERROR(read_int(j, "num_attention_heads", true, &m.heads));
  RETURN_IF_ERROR(read_int(j, "num_key_value_heads", true, &m.kv_heads));
  RETURN_IF_ERROR(read_int(j, "head_dim", true, &m.head_dim));
  RETURN_IF_ERROR(read_int(j, "qk_rope_head_dim", false, &m.qk_rope_dim));
  RETURN_IF_ERROR(read_int(j, "q_lora_rank", true, &m.q_lora_rank));
  RETURN_IF_ERROR(read_int(j, "o_groups", true, &m.o_groups));
  RETURN_IF_ERROR(read_int(j, "o_lora_rank", true, &m.o_lora_rank));
  RETURN_IF_ERROR(read_int(j, "sliding_window", true, &m.sliding_window));
  RETURN_IF_ERROR(read_int(j, "index_n_heads", true, &m.index_heads));
  RETURN_IF_ERROR(read_int(j, "index_head_dim", true, &m.index_head_dim));
  RETURN_IF_ERROR(read_int(j, "index_topk", true, &m.index_topk));
  RETURN_IF_ERROR(read_int(j, "hc_mult", false, &m.hc_mult));
  RETURN_IF_ERROR(read_int(j, "num_hash_layers", false, &m.hash_layers));
  RETURN_IF_ERROR(read_int(j, "num_nextn_predict_layers", false, &m.mtp_layers));
  if (auto rates = j.find("compress_rates"); rates != j.end() && rates->is_object()) {
    RETURN_IF_ERROR(read_int(*rates, "compressed_sparse_attention", false, &m.csa_ratio));
    RETURN_IF_ERROR(read_int(*rates, "heavily_compressed_attention", false, &m.hca_ratio));
  }
  if (auto cr = j.find("compress_ratios"); cr != j.end() && !cr->is_null()) {
    if (!cr->is_array()) return InvalidArgument("config.json: 'compress_ratios' must be an array");
    // One per main layer, then (hub config) the MTP layer's.
    if (cr->size() != size_t(m.layers) && cr->size() != size_t(m.layers) + 1) {
      return InvalidArgument(
          fmt::format("config.json: 'compress_ratios' has {} entries for {} layers (+1 for MTP)",
                      cr->size(), m.layers));
    }
    for (size_t i = 0; i < cr->size(); ++i) {
      if (!(*cr)[i].is_number_integer())
        return InvalidArgument("config.json: 'compress_ratios' must hold integers");
      int r = (*cr)[i].get<int>();
      if (i == size_t(m.layers)) {
        m.mtp_compress_ratio = r;
      } else {
        RETURN_IF_ERROR(count_ratio(r, &m));
      }
    }
  } else if (auto lt = j.find("layer_types"); lt != j.end() && lt->is_array()) {
    for (const auto& t : *lt) {
      std::string kind = t.is_string() ? t.get<std::string>() : "";
      if (kind == "sliding_attention") {
        ++m.sliding_layers;
      } else if (kind == "compressed_sparse_attention") {
        ++m.csa_layers;
      } else if (kind == "heavily_compressed_attention") {
        ++m.hca_layers;
      } else {
        return InvalidArgument(fmt::format("config.json: unknown layer type '{}'", kind));
      }
    }
  } else {
    return InvalidArgument("config.json: missing 'compress_ratios' (or 'layer_types')");
  }
  // Routed experts: "fp4" (the released checkpoints) or FP8 like every other linear.
  std::string expert_dtype = j.value("expert_dtype", "");
  if (auto q = j.find("quantization_config");
      expert_dtype.empty() && q != j.end() && q->is_object()) {
    expert_dtype = q->value("expert_dtype", "");
  }
  m.routed_weight_bytes = expert_dtype == "fp4" ? 0.5 + 1.0 / 32 : 1.0;
  RETURN_IF_ERROR(validate(m).with_context(name));
  return m;
}

}  // namespace

Result<ModelSpec> model_from_hf_config(const std::string& json_text, const std::string& name) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument(fmt::format("{}: not a JSON object", name));
  }
  if (j.value("model_type", "") == "deepseek_v4") return v4_from_hf_config(j, name);
  ModelSpec m;
  m.name = name;
  RETURN_IF_ERROR(read_int(j, "hidden_size", true, &m.hidden));
  RETURN_IF_ERROR(read_int(j, "num_hidden_layers", true, &m.layers));
  RETURN_IF_ERROR(read_int(j, "first_k_dense_replace", false, &m.first_dense_layers));
  RETURN_IF_ERROR(read_int(j, "intermediate_size", true, &m.dense_intermediate));
  RETURN_IF_ERROR(read_int(j, "moe_intermediate_size", true, &m.moe_intermediate));
  RETURN_IF_ERROR(read_int(j, "n_routed_experts", true, &m.routed_experts));
  RETURN_IF_ERROR(read_int(j, "n_shared_experts", false, &m.shared_experts));
  RETURN_IF_ERROR(read_int(j, "num_experts_per_tok", true, &m.experts_per_token));
  RETURN_IF_ERROR(read_int(j, "vocab_size", true, &m.vocab));
  RETURN_IF_ERROR(read_int(j, "num_attention_heads", true, &m.heads));
  RETURN_IF_ERROR(read_int(j, "q_lora_rank", false, &m.q_lora_rank));  // null in V2-Lite
  RETURN_IF_ERROR(read_int(j, "kv_lora_rank", true, &m.kv_lora_rank));
  RETURN_IF_ERROR(read_int(j, "qk_nope_head_dim", true, &m.qk_nope_dim));
  RETURN_IF_ERROR(read_int(j, "qk_rope_head_dim", true, &m.qk_rope_dim));
  RETURN_IF_ERROR(read_int(j, "v_head_dim", true, &m.v_head_dim));
  RETURN_IF_ERROR(read_int(j, "num_nextn_predict_layers", false, &m.mtp_layers));
  RETURN_IF_ERROR(validate(m).with_context(name));
  return m;
}

Result<ModelSpec> load_model_spec(const std::string& preset_or_path) {
  bool looks_like_path =
      preset_or_path.find('/') != std::string::npos || preset_or_path.ends_with(".json");
  if (!looks_like_path) return model_preset(preset_or_path);
  std::ifstream in(preset_or_path);
  if (!in) return IOError(fmt::format("cannot open model config '{}'", preset_or_path));
  std::stringstream ss;
  ss << in.rdbuf();
  return model_from_hf_config(ss.str(), preset_or_path);
}

namespace {

Status positive(int v, const char* what) {
  if (v <= 0) return InvalidArgument(fmt::format("{} must be positive (got {})", what, v));
  return Status::Ok();
}

Status validate_v4(const ModelSpec& m) {
  for (auto [v, what] : {std::pair{m.hidden, "hidden_size"},
                         {m.layers, "num_hidden_layers"},
                         {m.moe_intermediate, "moe_intermediate_size"},
                         {m.routed_experts, "n_routed_experts"},
                         {m.experts_per_token, "num_experts_per_tok"},
                         {m.vocab, "vocab_size"},
                         {m.heads, "num_attention_heads"},
                         {m.kv_heads, "num_key_value_heads"},
                         {m.head_dim, "head_dim"},
                         {m.q_lora_rank, "q_lora_rank"},
                         {m.o_groups, "o_groups"},
                         {m.o_lora_rank, "o_lora_rank"},
                         {m.sliding_window, "sliding_window"},
                         {m.index_heads, "index_n_heads"},
                         {m.index_head_dim, "index_head_dim"},
                         {m.index_topk, "index_topk"},
                         {m.hc_mult, "hc_mult"},
                         {m.csa_ratio, "CSA compress rate"},
                         {m.hca_ratio, "HCA compress rate"}}) {
    RETURN_IF_ERROR(positive(v, what));
  }
  if (m.sliding_layers + m.csa_layers + m.hca_layers != m.layers) {
    return InvalidArgument(
        fmt::format("compress ratios name {} sliding + {} CSA + {} HCA layers for {} layers",
                    m.sliding_layers, m.csa_layers, m.hca_layers, m.layers));
  }
  if (m.first_dense_layers != 0) return InvalidArgument("DeepSeek-V4 has no dense layers");
  if (m.experts_per_token > m.routed_experts) {
    return InvalidArgument("num_experts_per_tok exceeds n_routed_experts");
  }
  if (m.kv_heads != 1) {
    return Unimplemented("the cost model counts V4 attention with one shared KV head");
  }
  if ((m.heads * m.head_dim) % m.o_groups != 0) {
    return InvalidArgument("num_attention_heads * head_dim must divide into o_groups");
  }
  if (m.shared_experts < 0 || m.mtp_layers < 0 || m.hash_layers < 0 || m.hash_layers > m.layers ||
      m.routed_weight_bytes <= 0) {
    return InvalidArgument(
        "n_shared_experts, num_nextn_predict_layers, num_hash_layers must be in range");
  }
  return Status::Ok();
}

}  // namespace

Status validate(const ModelSpec& m) {
  if (m.v4()) return validate_v4(m);
  RETURN_IF_ERROR(positive(m.hidden, "hidden_size"));
  RETURN_IF_ERROR(positive(m.layers, "num_hidden_layers"));
  RETURN_IF_ERROR(positive(m.dense_intermediate, "intermediate_size"));
  RETURN_IF_ERROR(positive(m.moe_intermediate, "moe_intermediate_size"));
  RETURN_IF_ERROR(positive(m.routed_experts, "n_routed_experts"));
  RETURN_IF_ERROR(positive(m.experts_per_token, "num_experts_per_tok"));
  RETURN_IF_ERROR(positive(m.vocab, "vocab_size"));
  RETURN_IF_ERROR(positive(m.heads, "num_attention_heads"));
  RETURN_IF_ERROR(positive(m.kv_lora_rank, "kv_lora_rank"));
  RETURN_IF_ERROR(positive(m.qk_nope_dim, "qk_nope_head_dim"));
  RETURN_IF_ERROR(positive(m.v_head_dim, "v_head_dim"));
  if (m.first_dense_layers < 0 || m.first_dense_layers > m.layers) {
    return InvalidArgument("first_k_dense_replace must be in [0, num_hidden_layers]");
  }
  if (m.experts_per_token > m.routed_experts) {
    return InvalidArgument("num_experts_per_tok exceeds n_routed_experts");
  }
  if (m.q_lora_rank < 0 || m.qk_rope_dim < 0 || m.shared_experts < 0 || m.mtp_layers < 0) {
    return InvalidArgument(
        "q_lora_rank, qk_rope_head_dim, n_shared_experts and "
        "num_nextn_predict_layers must not be negative");
  }
  return Status::Ok();
}

}  // namespace moeserve::sim
