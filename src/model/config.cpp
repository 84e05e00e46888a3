#include "model/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/family.h"

namespace moeserve {

namespace {

using json = nlohmann::json;

// Reads fields of one JSON object, remembering the first error with the field's name.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string source) : obj_(obj), source_(std::move(source)) {}

  const Status& status() const { return status_; }
  bool has(const char* key) const { return obj_.contains(key) && !obj_[key].is_null(); }

  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt) {
    if (!has(key)) return missing(key, fallback);
    const json& v = obj_[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()) {
      return int64_t(v.get<double>());
    }
    fail(key, "must be an integer");
    return 0;
  }
  int64_t positive(const char* key, std::optional<int64_t> fallback = std::nullopt) {
    int64_t v = integer(key, fallback);
    if (status_.ok() && v <= 0) fail(key, "must be > 0, got " + std::to_string(v));
    return v;
  }
  double number(const char* key, std::optional<double> fallback = std::nullopt) {
    if (!has(key)) {
      if (fallback) return *fallback;
      fail(key, "is missing");
      return 0;
    }
    if (!obj_[key].is_number()) fail(key, "must be a number");
    return status_.ok() ? obj_[key].get<double>() : 0;
  }
  bool boolean(const char* key, std::optional<bool> fallback = std::nullopt) {
    if (!has(key)) {
      if (fallback) return *fallback;
      fail(key, "is missing");
      return false;
    }
    if (!obj_[key].is_boolean()) fail(key, "must be true or false");
    return status_.ok() && obj_[key].get<bool>();
  }
  std::string string(const char* key, std::optional<std::string> fallback = std::nullopt) {
    if (!has(key)) {
      if (fallback) return *fallback;
      fail(key, "is missing");
      return "";
    }
    if (!obj_[key].is_string()) fail(key, "must be a string");
    return status_.ok() ? obj_[key].get<std::string>() : "";
  }
  void fail(const std::string& key, const std::string& what) {
    if (status_.ok()) status_ = InvalidArgument(source_ + ": field '" + key + "' " + what);
  }

 private:
  int64_t missing(const char* key, std::optional<int64_t> fallback) {
    if (fallback) return *fallback;
    fail(key, "is missing");
    return 0;
  }

  const json& obj_;
  std::string source_;
  Status status_;
};

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

Status parse_rope_scaling(const json& j, const std::string& source, ModelConfig* out) {
  ModelConfig& c = *out;
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    if (!rs.is_object())
      return InvalidArgument(source + ": field 'rope_scaling' must be an object");
    FieldReader s(rs, source + ": rope_scaling");
    std::string type = s.has("rope_type") ? s.string("rope_type") : s.string("type");
    RETURN_IF_ERROR(s.status());
    if (type != "yarn") {
      return Unimplemented(source + ": rope_scaling type '" + type + "' (only yarn is supported)");
    }
    YarnScaling y;
    y.factor = s.number("factor");
    y.original_max_position_embeddings = s.positive("original_max_position_embeddings");
    y.beta_fast = s.number("beta_fast", 32.0);
    y.beta_slow = s.number("beta_slow", 1.0);
    y.mscale = s.number("mscale", 1.0);
    y.mscale_all_dim = s.number("mscale_all_dim", 0.0);
    RETURN_IF_ERROR(s.status());
    if (y.factor <= 0) return InvalidArgument(source + ": field 'rope_scaling.factor' must be > 0");
    c.rope_scaling = y;
  }

  return Status::Ok();
}

Status parse_quantization(const json& j, const std::string& source, ModelConfig* out) {
  ModelConfig& c = *out;
  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const json& q = j["quantization_config"];
    if (!q.is_object()) {
      return InvalidArgument(source + ": field 'quantization_config' must be an object");
    }
    FieldReader s(q, source + ": quantization_config");
    std::string method = s.string("quant_method");
    std::string fmt = s.string("fmt", "e4m3");
    std::string scale_fmt = s.string("scale_fmt", "float");
    RETURN_IF_ERROR(s.status());
    if (scale_fmt != "float" && scale_fmt != "ue8m0") {
      return Unimplemented(source + ": quantization_config scale_fmt '" + scale_fmt +
                           "' (float or ue8m0)");
    }
    if (method != "fp8" || fmt != "e4m3") {
      return Unimplemented(source + ": quantization_config " + method + "/" + fmt +
                           " (only fp8/e4m3 block scaling is supported)");
    }
    QuantConfig qc;
    qc.ue8m0 = scale_fmt == "ue8m0";
    if (q.contains("weight_block_size")) {
      const json& b = q["weight_block_size"];
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() ||
          !b[1].is_number_integer() || b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0) {
        return InvalidArgument(source +
                               ": field 'quantization_config.weight_block_size' must be [n, k]");
      }
      qc.block_n = b[0].get<int64_t>();
      qc.block_k = b[1].get<int64_t>();
    }
    c.quant = qc;
  }
  return Status::Ok();
}

// DeepSeek-V4's config.json as DeepSeek publishes it (docs/deepseek-v4.md).
Result<ModelConfig> parse_v4_config(const json& j, FieldReader& r, ModelConfig c,
                                    const std::string& source) {
  V4Config v;
  c.vocab_size = r.positive("vocab_size");
  c.hidden_size = r.positive("hidden_size");
  c.num_hidden_layers = r.positive("num_hidden_layers");
  c.num_attention_heads = r.positive("num_attention_heads");
  v.head_dim = r.positive("head_dim");
  c.qk_rope_head_dim = r.positive("qk_rope_head_dim");
  c.q_lora_rank = r.positive("q_lora_rank");
  v.o_groups = r.positive("o_groups");
  v.o_lora_rank = r.positive("o_lora_rank");
  v.sliding_window = r.positive("sliding_window");
  c.rope_theta = r.number("rope_theta", 10000.0);
  v.compress_rope_theta = r.number("compress_rope_theta", 160000.0);
  v.hc_mult = r.positive("hc_mult");
  v.hc_sinkhorn_iters = r.positive("hc_sinkhorn_iters");
  v.hc_eps = r.number("hc_eps", 1e-6);
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  c.n_routed_experts = r.positive("n_routed_experts");
  c.num_experts_per_tok = r.positive("num_experts_per_tok");
  c.n_shared_experts = r.integer("n_shared_experts", 1);
  c.moe_intermediate_size = r.positive("moe_intermediate_size");
  c.norm_topk_prob = r.boolean("norm_topk_prob", true);
  c.routed_scaling_factor = r.number("routed_scaling_factor", 1.0);
  v.num_hash_layers = r.integer("num_hash_layers", 0);
  v.swiglu_limit = r.number("swiglu_limit", 0.0);
  c.max_position_embeddings = r.positive("max_position_embeddings");
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.num_nextn_predict_layers = r.integer("num_nextn_predict_layers", 0);
  const std::string scoring = r.string("scoring_func", "sqrtsoftplus");
  const std::string method = r.string("topk_method", "noaux_tc");
  const std::string expert_dtype = r.string("expert_dtype", "fp8");
  RETURN_IF_ERROR(r.status());
  if (scoring != "sqrtsoftplus")
    r.fail("scoring_func", "is '" + scoring + "'; V4 uses sqrtsoftplus");
  if (method != "noaux_tc") r.fail("topk_method", "is '" + method + "'; V4 uses noaux_tc");
  if (expert_dtype != "fp4" && expert_dtype != "fp8") {
    r.fail("expert_dtype", "is '" + expert_dtype + "'; expected fp4 or fp8");
  }
  if (r.has("num_key_value_heads") && r.integer("num_key_value_heads") != 1) {
    r.fail("num_key_value_heads", "must be 1 (V4's one shared KV head)");
  }
  if (r.has("n_group") && r.integer("n_group") != 1) r.fail("n_group", "must be 1 for V4");
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    if (r.has(key))
      (std::string(key) == "bos_token_id" ? c.bos_token_id : c.eos_token_id) = r.integer(key);
  }
  RETURN_IF_ERROR(r.status());
  c.scoring_func = ScoringFunc::kSqrtSoftplus;
  c.topk_method = TopkMethod::kNoauxTc;
  v.fp4_experts = expert_dtype == "fp4";
  c.first_k_dense_replace = 0;
  c.kv_lora_rank = v.head_dim - c.qk_rope_head_dim;
  c.qk_nope_head_dim = v.head_dim - c.qk_rope_head_dim;
  c.v_head_dim = v.head_dim;
  if (c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim >= v.head_dim) {
    r.fail("qk_rope_head_dim", "must be even and below head_dim");
  }
  if (c.num_attention_heads * v.head_dim % v.o_groups != 0 || c.num_attention_heads % v.o_groups) {
    r.fail("o_groups", "must divide num_attention_heads");
  }
  if (c.n_shared_experts != 1) r.fail("n_shared_experts", "must be 1 (V4 has one shared expert)");
  if (c.num_experts_per_tok > c.n_routed_experts) {
    r.fail("num_experts_per_tok", "exceeds n_routed_experts");
  }
  if (v.num_hash_layers < 0 || v.num_hash_layers > c.num_hidden_layers) {
    r.fail("num_hash_layers", "must be within [0, num_hidden_layers]");
  }
  if (c.num_nextn_predict_layers < 0) r.fail("num_nextn_predict_layers", "must be >= 0");
  if (c.rms_norm_eps <= 0) r.fail("rms_norm_eps", "must be > 0");
  if (v.hc_eps < 0) r.fail("hc_eps", "must be >= 0");
  if (v.hc_mult > 16) r.fail("hc_mult", "must be at most 16 (V4 has 4 streams)");
  RETURN_IF_ERROR(r.status());
  const json* ratios = j.contains("compress_ratios") ? &j["compress_ratios"] : nullptr;
  if (!ratios || !ratios->is_array()) {
    return InvalidArgument(source +
                           ": field 'compress_ratios' must be a list (one ratio per layer)");
  }
  for (const json& x : *ratios) {
    if (!x.is_number_integer() ||
        (x.get<int64_t>() != 0 && x.get<int64_t>() != 4 && x.get<int64_t>() != 128)) {
      return InvalidArgument(source + ": field 'compress_ratios' holds " + x.dump() +
                             "; each must be 0, 4 or 128");
    }
    v.compress_ratios.push_back(x.get<int64_t>());
  }
  const int64_t want = c.num_hidden_layers + c.num_nextn_predict_layers;
  if (int64_t(v.compress_ratios.size()) == c.num_hidden_layers) {
    v.compress_ratios.resize(size_t(want), 0);  // the MTP layer: sliding window only
  }
  if (int64_t(v.compress_ratios.size()) < want) {
    return InvalidArgument(
        fmt::format("{}: field 'compress_ratios' has {} entries; num_hidden_layers + "
                    "num_nextn_predict_layers is {}",
                    source, v.compress_ratios.size(), want));
  }
  v.compress_ratios.resize(size_t(want));
  bool any_csa = false;
  for (int64_t x : v.compress_ratios) any_csa |= x == 4;
  if (any_csa) {
    IndexerConfig ix;
    ix.n_heads = r.positive("index_n_heads");
    ix.head_dim = r.positive("index_head_dim");
    ix.topk = r.positive("index_topk");
    RETURN_IF_ERROR(r.status());
    if (c.qk_rope_head_dim >= ix.head_dim) {
      r.fail("index_head_dim", "must exceed qk_rope_head_dim (its last dims carry RoPE)");
    }
    c.indexer = ix;
  }
  RETURN_IF_ERROR(r.status());
  RETURN_IF_ERROR(parse_rope_scaling(j, source, &c));
  RETURN_IF_ERROR(parse_quantization(j, source, &c));
  if (c.quant && !c.quant->ue8m0) {
    return InvalidArgument(source + ": quantization_config: V4 checkpoints use scale_fmt ue8m0");
  }
  c.v4 = std::move(v);
  return c;
}

}  // namespace

double ModelConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(double(qk_head_dim()));
  if (rope_scaling && rope_scaling->mscale_all_dim != 0.0) {
    double m = yarn_get_mscale(rope_scaling->factor, rope_scaling->mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

Result<ModelConfig> parse_model_config(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument(source + ": not a JSON object");
  }
  FieldReader r(j, source);
  ModelConfig c;
  c.model_type = r.string("model_type");
  RETURN_IF_ERROR(r.status());
  std::vector<std::string> architectures;
  if (auto a = j.find("architectures"); a != j.end() && a->is_array()) {
    for (const auto& x : *a) {
      if (x.is_string()) architectures.push_back(x.get<std::string>());
    }
  }
  // Which architectures run at all is the family table's to say (model/family.h).
  RETURN_IF_ERROR(find_model_family(c.model_type, architectures, source).status());
  if (c.model_type == "deepseek_v4") return parse_v4_config(j, r, std::move(c), source);
  // V3.2 is V3.1 with sparse attention: V3's defaults.
  bool v3 = c.model_type == "deepseek_v3" || c.model_type == "deepseek_v32";
  if (r.has("hidden_act") && r.string("hidden_act") != "silu") {
    r.fail("hidden_act", "must be \"silu\"");
  }
  c.vocab_size = r.positive("vocab_size");
  c.hidden_size = r.positive("hidden_size");
  c.num_hidden_layers = r.positive("num_hidden_layers");
  c.num_attention_heads = r.positive("num_attention_heads");
  c.first_k_dense_replace = r.integer("first_k_dense_replace", 0);
  c.moe_layer_freq = r.positive("moe_layer_freq", 1);
  c.n_routed_experts = r.integer("n_routed_experts", 0);
  c.kv_lora_rank = r.positive("kv_lora_rank");
  c.qk_nope_head_dim = r.positive("qk_nope_head_dim");
  c.qk_rope_head_dim = r.positive("qk_rope_head_dim");
  c.v_head_dim = r.positive("v_head_dim");
  c.max_position_embeddings = r.positive("max_position_embeddings");
  c.rope_theta = r.number("rope_theta", 10000.0);
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.num_nextn_predict_layers = r.integer("num_nextn_predict_layers", 0);
  if (r.has("q_lora_rank")) c.q_lora_rank = r.positive("q_lora_rank");
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    if (!r.has(key)) continue;
    const json& v = j[key];
    std::optional<int64_t> id;
    if (v.is_number_integer()) id = v.get<int64_t>();
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) id = v[0].get<int64_t>();
    if (!id) r.fail(key, "must be an integer or a list of integers");
    (std::string(key) == "bos_token_id" ? c.bos_token_id : c.eos_token_id) = id;
  }
  RETURN_IF_ERROR(r.status());

  bool has_dense = c.first_k_dense_replace > 0 || c.moe_layer_freq > 1 || c.n_routed_experts == 0;
  if (has_dense) c.intermediate_size = r.positive("intermediate_size");
  if (c.n_routed_experts > 0) {
    c.moe_intermediate_size = r.positive("moe_intermediate_size");
    c.n_shared_experts = r.integer("n_shared_experts", 0);
    c.num_experts_per_tok = r.positive("num_experts_per_tok");
    c.n_group = r.positive("n_group", 1);
    c.topk_group = r.positive("topk_group", 1);
    c.norm_topk_prob = r.boolean("norm_topk_prob", false);
    c.routed_scaling_factor = r.number("routed_scaling_factor", 1.0);
    std::string method = r.string("topk_method", v3 ? "noaux_tc" : "greedy");
    std::string scoring = r.string("scoring_func", v3 ? "sigmoid" : "softmax");
    RETURN_IF_ERROR(r.status());
    if (method == "noaux_tc") {
      c.topk_method = TopkMethod::kNoauxTc;
    } else if (method == "group_limited_greedy") {
      c.topk_method = TopkMethod::kGroupLimitedGreedy;
    } else if (method == "greedy") {
      c.topk_method = TopkMethod::kGreedy;
    } else {
      r.fail("topk_method",
             "is '" + method + "'; expected noaux_tc, group_limited_greedy or greedy");
    }
    if (scoring == "sigmoid") {
      c.scoring_func = ScoringFunc::kSigmoid;
    } else if (scoring == "softmax") {
      c.scoring_func = ScoringFunc::kSoftmax;
    } else {
      r.fail("scoring_func", "is '" + scoring + "'; expected sigmoid or softmax");
    }
    RETURN_IF_ERROR(r.status());
    if (c.n_shared_experts < 0) r.fail("n_shared_experts", "must be >= 0");
    if (c.num_experts_per_tok > c.n_routed_experts) {
      r.fail("num_experts_per_tok", "exceeds n_routed_experts");
    }
    if (c.n_routed_experts % c.n_group != 0) r.fail("n_group", "must divide n_routed_experts");
    if (c.topk_group > c.n_group) r.fail("topk_group", "exceeds n_group");
    if (c.topk_method == TopkMethod::kNoauxTc && c.n_group > 1 &&
        c.n_routed_experts / c.n_group < 2) {
      r.fail("n_group", "leaves fewer than 2 experts per group (noaux_tc scores groups by top-2)");
    }
    if (c.topk_method != TopkMethod::kGreedy && c.n_group > 1 &&
        c.topk_group * (c.n_routed_experts / c.n_group) < c.num_experts_per_tok) {
      r.fail("topk_group", "selects groups holding fewer than num_experts_per_tok experts");
    }
  }
  if (c.model_type == "deepseek_v32") {
    IndexerConfig ix;
    ix.n_heads = r.positive("index_n_heads");
    ix.head_dim = r.positive("index_head_dim");
    ix.topk = r.positive("index_topk");
    RETURN_IF_ERROR(r.status());
    // One FP8 scale per 128-value key (DeepSeek's act_quant block) and a 128-point Hadamard.
    if (ix.head_dim != 128) r.fail("index_head_dim", "must be 128 (DeepSeek's indexer)");
    if (c.qk_rope_head_dim >= ix.head_dim) {
      r.fail("qk_rope_head_dim", "must be below index_head_dim (the indexer's RoPE dims)");
    }
    if (!c.q_lora_rank) r.fail("q_lora_rank", "is needed by the indexer (its query input)");
    c.indexer = ix;
  }
  if (c.first_k_dense_replace < 0) r.fail("first_k_dense_replace", "must be >= 0");
  if (c.num_nextn_predict_layers < 0) r.fail("num_nextn_predict_layers", "must be >= 0");
  if (c.qk_rope_head_dim % 2 != 0) r.fail("qk_rope_head_dim", "must be even (rotary pairs)");
  if (c.rms_norm_eps <= 0) r.fail("rms_norm_eps", "must be > 0");
  if (c.rope_theta <= 0) r.fail("rope_theta", "must be > 0");
  RETURN_IF_ERROR(r.status());

  RETURN_IF_ERROR(parse_rope_scaling(j, source, &c));
  RETURN_IF_ERROR(parse_quantization(j, source, &c));
  return c;
}

Result<ModelConfig> load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

namespace {

json yarn_json(const YarnScaling& y, bool mscales) {
  json r = {{"type", "yarn"},
            {"factor", y.factor},
            {"original_max_position_embeddings", y.original_max_position_embeddings},
            {"beta_fast", y.beta_fast},
            {"beta_slow", y.beta_slow}};
  if (mscales) {
    r["mscale"] = y.mscale;
    r["mscale_all_dim"] = y.mscale_all_dim;
  }
  return r;
}

// DeepSeek-V4's config.json in DeepSeek's own keys (what parse_v4_config reads).
std::string v4_config_to_json(const ModelConfig& c) {
  const V4Config& v = *c.v4;
  json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = v.head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["q_lora_rank"] = *c.q_lora_rank;
  j["o_groups"] = v.o_groups;
  j["o_lora_rank"] = v.o_lora_rank;
  j["sliding_window"] = v.sliding_window;
  j["compress_ratios"] = v.compress_ratios;
  j["compress_rope_theta"] = v.compress_rope_theta;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling) j["rope_scaling"] = yarn_json(*c.rope_scaling, /*mscales=*/false);
  if (c.indexer) {
    j["index_n_heads"] = c.indexer->n_heads;
    j["index_head_dim"] = c.indexer->head_dim;
    j["index_topk"] = c.indexer->topk;
  }
  j["hc_mult"] = v.hc_mult;
  j["hc_sinkhorn_iters"] = v.hc_sinkhorn_iters;
  j["hc_eps"] = v.hc_eps;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["n_routed_experts"] = c.n_routed_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_shared_experts"] = c.n_shared_experts;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["scoring_func"] = "sqrtsoftplus";
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["topk_method"] = "noaux_tc";
  j["num_hash_layers"] = v.num_hash_layers;
  j["swiglu_limit"] = v.swiglu_limit;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["max_position_embeddings"] = c.max_position_embeddings;
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id) j["eos_token_id"] = *c.eos_token_id;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "bfloat16";
  j["expert_dtype"] = v.fp4_experts ? "fp4" : "fp8";
  if (c.quant) {
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"scale_fmt", "ue8m0"},
                                {"activation_scheme", "dynamic"},
                                {"weight_block_size", {c.quant->block_n, c.quant->block_k}}};
  }
  return j.dump(2) + "\n";
}

}  // namespace

std::string model_config_to_json(const ModelConfig& c) {
  if (c.v4) return v4_config_to_json(c);
  json j;
  j["architectures"] = {c.model_type == "deepseek_v32"  ? "DeepseekV32ForCausalLM"
                        : c.model_type == "deepseek_v3" ? "DeepseekV3ForCausalLM"
                                                        : "DeepseekV2ForCausalLM"};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_attention_heads;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["topk_method"] = c.topk_method == TopkMethod::kNoauxTc              ? "noaux_tc"
                     : c.topk_method == TopkMethod::kGroupLimitedGreedy ? "group_limited_greedy"
                                                                        : "greedy";
  j["scoring_func"] = c.scoring_func == ScoringFunc::kSigmoid ? "sigmoid" : "softmax";
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["q_lora_rank"] = c.q_lora_rank ? json(*c.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling) {
    j["rope_scaling"] = yarn_json(*c.rope_scaling, /*mscales=*/true);
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id) j["eos_token_id"] = *c.eos_token_id;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  if (c.indexer) {
    j["index_n_heads"] = c.indexer->n_heads;
    j["index_head_dim"] = c.indexer->head_dim;
    j["index_topk"] = c.indexer->topk;
  }
  j["torch_dtype"] = "bfloat16";
  if (c.quant) {
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"activation_scheme", "dynamic"},
                                {"weight_block_size", {c.quant->block_n, c.quant->block_k}}};
  }
  return j.dump(2) + "\n";
}

}  // namespace moeserve
