#include "sim/model_spec.h"

#include <fstream>
#include <sstream>

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
  } else {
    return InvalidArgument(fmt::format(
        "unknown model preset '{}' (known: deepseek-v3, deepseek-r1, deepseek-v2-lite; or give "
        "the path of a config.json)",
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

}  // namespace

Result<ModelSpec> model_from_hf_config(const std::string& json_text, const std::string& name) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument(fmt::format("{}: not a JSON object", name));
  }
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

Status validate(const ModelSpec& m) {
  auto positive = [](int v, const char* what) -> Status {
    if (v <= 0) return InvalidArgument(fmt::format("{} must be positive (got {})", what, v));
    return Status::Ok();
  };
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
