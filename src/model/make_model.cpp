#include "model/make_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"

namespace moeserve {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// DeepSeek-V4 as DeepSeek's config.json writes it (docs/deepseek-v4.md), at tiny widths with every
// layer kind: sliding window (0), heavily compressed (128) and compressed sparse (4) attention,
// hash-routed first layers, FP4 experts, an MTP layer (ratio 0).
json v4_preset_json(int64_t hidden, int64_t heads, int64_t head_dim, int64_t rope, int64_t q_lora,
                    int64_t o_groups, int64_t o_lora, std::vector<int64_t> ratios, int64_t experts,
                    int64_t top_k, int64_t inter, int64_t index_heads, int64_t index_topk) {
  const int64_t layers = int64_t(ratios.size()) - 1;
  return {{"architectures", {"DeepseekV4ForCausalLM"}},
          {"model_type", "deepseek_v4"},
          {"vocab_size", 129280},
          {"hidden_size", hidden},
          {"num_hidden_layers", layers},
          {"num_attention_heads", heads},
          {"num_key_value_heads", 1},
          {"head_dim", head_dim},
          {"qk_rope_head_dim", rope},
          {"q_lora_rank", q_lora},
          {"o_groups", o_groups},
          {"o_lora_rank", o_lora},
          {"sliding_window", 128},
          {"compress_ratios", ratios},
          {"compress_rope_theta", 160000.0},
          {"rope_theta", 10000.0},
          {"rope_scaling",
           {{"type", "yarn"},
            {"factor", 16},
            {"original_max_position_embeddings", 65536},
            {"beta_fast", 32},
            {"beta_slow", 1}}},
          {"index_n_heads", index_heads},
          {"index_head_dim", 128},
          {"index_topk", index_topk},
          {"hc_mult", 4},
          {"hc_sinkhorn_iters", 20},
          {"hc_eps", 1e-6},
          {"rms_norm_eps", 1e-6},
          {"n_routed_experts", experts},
          {"num_experts_per_tok", top_k},
          {"n_shared_experts", 1},
          {"moe_intermediate_size", inter},
          {"scoring_func", "sqrtsoftplus"},
          {"norm_topk_prob", true},
          {"routed_scaling_factor", 1.5},
          {"topk_method", "noaux_tc"},
          {"num_hash_layers", std::min<int64_t>(3, layers)},
          {"swiglu_limit", 10.0},
          {"num_nextn_predict_layers", 1},
          {"max_position_embeddings", 1048576},
          {"bos_token_id", 0},
          {"eos_token_id", 1},
          {"tie_word_embeddings", false},
          {"expert_dtype", "fp4"}};
}

json preset_json(const std::string& name) {
  if (name == "v4-tiny") {
    return v4_preset_json(256, 4, 128, 32, 192, 2, 64, {0, 128, 4, 128, 4, 0, 0}, 16, 2, 128, 8,
                          64);
  }
  if (name == "v4-flash-bench") {
    // V4-Flash's per-layer widths (hidden 4096, 64 heads of 512, q_lora 1024, 8 output groups
    // of 1024, the indexer's 64 x 128 and top-512, 2048-wide experts, top 6) with 4 layers (one
    // sliding, then CSA, HCA, CSA) and 16 experts.
    return v4_preset_json(4096, 64, 512, 64, 1024, 8, 1024, {0, 4, 128, 4, 0}, 16, 6, 2048, 64,
                          512);
  }
  if (name == "v32-tiny") {
    // The tiny preset as DeepSeek-V3.2 (docs/dsa.md): the lightning indexer in every layer, 16
    // heads of 128, and a top-k of 16 so that attention is sparse from the 17th token on.
    json j = preset_json("tiny");
    j["model_type"] = "deepseek_v32";
    j["index_n_heads"] = 16;
    j["index_head_dim"] = 128;
    j["index_topk"] = 16;
    return j;
  }
  if (name == "tiny") {
    // The README's embedded default: the real vocabulary (so the DeepSeek-V3 tokenizer works),
    // V3 features (q_lora, noaux_tc over groups, shared expert, dense first layer), tiny widths.
    return {{"model_type", "deepseek_v3"},
            {"vocab_size", 129280},
            {"hidden_size", 256},
            {"intermediate_size", 512},
            {"moe_intermediate_size", 128},
            {"num_hidden_layers", 4},
            {"first_k_dense_replace", 1},
            {"moe_layer_freq", 1},
            {"num_attention_heads", 4},
            {"n_routed_experts", 16},
            {"n_shared_experts", 1},
            {"num_experts_per_tok", 4},
            {"n_group", 4},
            {"topk_group", 2},
            {"topk_method", "noaux_tc"},
            {"scoring_func", "sigmoid"},
            {"norm_topk_prob", true},
            {"routed_scaling_factor", 2.5},
            {"q_lora_rank", 192},
            {"kv_lora_rank", 128},
            {"qk_nope_head_dim", 32},
            {"qk_rope_head_dim", 16},
            {"v_head_dim", 32},
            {"rope_theta", 10000.0},
            {"max_position_embeddings", 4096},
            {"rms_norm_eps", 1e-6},
            {"tie_word_embeddings", false},
            {"bos_token_id", 0},
            {"eos_token_id", 1},
            {"num_nextn_predict_layers", 1}};
  }
  if (name == "bench") {
    // DeepSeek-V3 proportions at ~2.5 GB of FP8: real MLA head dims (kv_lora 512 + rope 64 =
    // the 576-value latent), 64 routed experts, top-8 over 8 groups (4 kept), one shared expert.
    return {{"model_type", "deepseek_v3"},
            {"vocab_size", 129280},
            {"hidden_size", 2048},
            {"intermediate_size", 5632},
            {"moe_intermediate_size", 512},
            {"num_hidden_layers", 12},
            {"first_k_dense_replace", 1},
            {"moe_layer_freq", 1},
            {"num_attention_heads", 16},
            {"n_routed_experts", 64},
            {"n_shared_experts", 1},
            {"num_experts_per_tok", 8},
            {"n_group", 8},
            {"topk_group", 4},
            {"topk_method", "noaux_tc"},
            {"scoring_func", "sigmoid"},
            {"norm_topk_prob", true},
            {"routed_scaling_factor", 2.5},
            {"q_lora_rank", 512},
            {"kv_lora_rank", 512},
            {"qk_nope_head_dim", 128},
            {"qk_rope_head_dim", 64},
            {"v_head_dim", 128},
            {"rope_theta", 10000.0},
            {"max_position_embeddings", 16384},
            {"rms_norm_eps", 1e-6},
            {"tie_word_embeddings", false},
            {"bos_token_id", 0},
            {"eos_token_id", 1},
            {"num_nextn_predict_layers", 0}};
  }
  if (name == "v2-lite-tiny") {
    // V2-Lite's features: plain q_proj, softmax greedy gate, two shared experts.
    return {{"model_type", "deepseek_v2"},
            {"vocab_size", 129280},
            {"hidden_size", 256},
            {"intermediate_size", 512},
            {"moe_intermediate_size", 96},
            {"num_hidden_layers", 3},
            {"first_k_dense_replace", 1},
            {"moe_layer_freq", 1},
            {"num_attention_heads", 4},
            {"n_routed_experts", 8},
            {"n_shared_experts", 2},
            {"num_experts_per_tok", 2},
            {"n_group", 1},
            {"topk_group", 1},
            {"topk_method", "greedy"},
            {"scoring_func", "softmax"},
            {"norm_topk_prob", false},
            {"routed_scaling_factor", 1.0},
            {"q_lora_rank", nullptr},
            {"kv_lora_rank", 128},
            {"qk_nope_head_dim", 32},
            {"qk_rope_head_dim", 16},
            {"v_head_dim", 32},
            {"rope_theta", 10000.0},
            {"max_position_embeddings", 4096},
            {"rms_norm_eps", 1e-6},
            {"tie_word_embeddings", false},
            {"bos_token_id", 0},
            {"eos_token_id", 1},
            {"num_nextn_predict_layers", 0}};
  }
  return nullptr;
}

// Counter-based generator: value i of a tensor depends only on (seed, tensor, i), so results do
// not depend on the thread split.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t name_hash(const std::string& s, uint64_t seed) {
  uint64_t h = mix(seed ^ 0x51ed270b27a3f0c1ull);
  for (unsigned char ch : s) h = mix(h ^ ch);
  return h;
}
// Uniform in [-1, 1).
float uniform(uint64_t key, uint64_t i) {
  return float(int64_t(mix(key + i) >> 11) * (1.0 / 4503599627370496.0) - 1.0);
}

class ModelWriter {
 public:
  ModelWriter(const ModelConfig& c, uint64_t seed, ThreadPool* pool)
      : c_(c), seed_(seed), pool_(pool) {}

  // rows x cols e4m3 values uniform over [-448, 448), keyed by `key` and the seed.
  std::vector<uint8_t> fp8_values(const std::string& key_name, int64_t rows, int64_t cols) {
    const uint64_t key = name_hash(key_name, seed_);
    std::vector<uint8_t> q(size_t(rows * cols));
    auto fill = [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * cols; i < r1 * cols; ++i) {
        q[size_t(i)] = f32_to_fp8e4m3(uniform(key, uint64_t(i)) * kFp8E4M3Max);
      }
    };
    pool_ ? pool_->parallel_for(rows, fill, 64) : fill(0, rows);
    return q;
  }

  // FP8 projection [rows, cols] with per-block scales; values ~ uniform with std 1/sqrt(cols)
  // (times gain), block scales varied by +-25% so that scales matter.
  void fp8_linear(SafetensorsWriter& w, const std::string& name, int64_t rows, int64_t cols,
                  float gain = 1.0f) {
    if (!c_.quant) {
      bf16_tensor(w, name, {rows, cols}, gain * std::sqrt(3.0f / float(cols)), 0.0f);
      return;
    }
    const int64_t bn = c_.quant->block_n, bk = c_.quant->block_k;
    const int64_t sr = (rows + bn - 1) / bn, sc = (cols + bk - 1) / bk;
    const std::vector<uint8_t> q = fp8_values(name, rows, cols);
    std::vector<float> scale(size_t(sr * sc));
    const float base = gain * std::sqrt(1.0f / float(cols)) / (kFp8E4M3Max / std::sqrt(3.0f));
    uint64_t skey = name_hash(name + "#scale", seed_);
    for (int64_t i = 0; i < sr * sc; ++i) {
      scale[size_t(i)] = base * (1.0f + 0.25f * uniform(skey, uint64_t(i)));
    }
    w.add(name, DType::kF8E4M3, {rows, cols}, q.data(), q.size());
    w.add(name + "_scale_inv", DType::kF32, {sr, sc}, scale.data(), scale.size() * 4);
  }

  // BF16 tensor with values center + amplitude * uniform[-1, 1).
  void bf16_tensor(SafetensorsWriter& w, const std::string& name, std::vector<int64_t> shape,
                   float amplitude, float center) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    uint64_t key = name_hash(name, seed_);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    auto fill = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        v[size_t(i)] = f32_to_bf16(center + amplitude * uniform(key, uint64_t(i)));
      }
    };
    pool_ ? pool_->parallel_for(n, fill, 1 << 16) : fill(0, n);
    w.add(name, DType::kBF16, std::move(shape), v.data(), v.size() * 2);
  }

  void f32_tensor(SafetensorsWriter& w, const std::string& name, int64_t n, float lo, float hi) {
    uint64_t key = name_hash(name, seed_);
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      v[size_t(i)] = lo + (hi - lo) * 0.5f * (uniform(key, uint64_t(i)) + 1.0f);
    }
    w.add(name, DType::kF32, {n}, v.data(), v.size() * 4);
  }

  void norm(SafetensorsWriter& w, const std::string& name, int64_t n) {
    bf16_tensor(w, name, {n}, 0.1f, 1.0f);
  }

  void mlp(SafetensorsWriter& w, const std::string& p, int64_t hidden, int64_t inter) {
    fp8_linear(w, p + ".gate_proj.weight", inter, hidden);
    fp8_linear(w, p + ".up_proj.weight", inter, hidden);
    fp8_linear(w, p + ".down_proj.weight", hidden, inter);
  }

  // The MTP module after the last layer, in the official layout but for the copies of the
  // embedding and lm_head (model.layers.<L>.embed_tokens, .shared_head.head), which the loader
  // skips: the module shares the main model's (docs/mtp.md). eh_proj is BF16 as released.
  void mtp(SafetensorsWriter& w) {
    const int64_t H = c_.hidden_size, L = c_.num_hidden_layers;
    std::string p = fmt::format("model.layers.{}.", L);
    layer(w, L);
    norm(w, p + "enorm.weight", H);
    norm(w, p + "hnorm.weight", H);
    bf16_tensor(w, p + "eh_proj.weight", {H, 2 * H}, std::sqrt(3.0f / float(2 * H)), 0.0f);
    norm(w, p + "shared_head.norm.weight", H);
  }

  // ---- DeepSeek-V4, in DeepSeek's names and formats (docs/deepseek-v4.md) ----

  // FP8 [rows, cols] with a UE8M0 '<stem>.scale' per 128 x 128 block: values ~ std
  // gain / sqrt(cols), block scales powers of two varied by a factor of 2 either way.
  void fp8_ue8m0(SafetensorsWriter& w, const std::string& stem, int64_t rows, int64_t cols,
                 float gain = 1.0f) {
    const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    const std::vector<uint8_t> q = fp8_values(stem, rows, cols);
    const double base = gain * std::sqrt(1.0 / double(cols)) / (kFp8E4M3Max / std::sqrt(3.0));
    w.add(stem + ".weight", DType::kF8E4M3, {rows, cols}, q.data(), q.size());
    ue8m0_scales(w, stem, sr, sc, base);
  }

  // FP4 e2m1 [rows, cols] as I8 pairs (element 2j in the low nibble of byte j) with UE8M0 per
  // 1 x 32: nibbles uniform over the 15 values but -0, scales around gain / sqrt(cols) over the
  // values' rms (2.93).
  void fp4_ue8m0(SafetensorsWriter& w, const std::string& stem, int64_t rows, int64_t cols) {
    uint64_t key = name_hash(stem, seed_);
    std::vector<uint8_t> q(size_t(rows * cols / 2));
    for (size_t i = 0; i < q.size(); ++i) {
      uint8_t b = 0;
      for (int h = 0; h < 2; ++h) {
        const uint64_t r = mix(key + 2 * i + uint64_t(h)) % 15;
        b |= uint8_t((r < 8 ? r : r + 1) << (4 * h));
      }
      q[i] = b;
    }
    w.add(stem + ".weight", DType::kI8, {rows, cols / 2}, q.data(), q.size());
    ue8m0_scales(w, stem, rows, cols / 32, std::sqrt(1.0 / double(cols)) / 2.93);
  }

  void ue8m0_scales(SafetensorsWriter& w, const std::string& stem, int64_t r, int64_t c,
                    double base) {
    uint64_t skey = name_hash(stem + "#scale", seed_);
    const int e = int(std::lround(std::log2(base)));
    std::vector<uint8_t> s(size_t(r * c));
    for (size_t i = 0; i < s.size(); ++i) s[i] = uint8_t(127 + e + int(mix(skey + i) % 3) - 1);
    w.add(stem + ".scale", DType::kF8E8M0, {r, c}, s.data(), s.size());
  }

  // F32 tensor with values center + amplitude * uniform[-1, 1).
  void f32_nd(SafetensorsWriter& w, const std::string& name, std::vector<int64_t> shape,
              float amplitude, float center) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    uint64_t key = name_hash(name, seed_);
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = center + amplitude * uniform(key, uint64_t(i));
    w.add(name, DType::kF32, std::move(shape), v.data(), v.size() * 4);
  }

  // An mHC site: fn small (the mixes stay near their bases), bases and scales of order one.
  void hc(SafetensorsWriter& w, const std::string& stem, int64_t mixes, int64_t scales) {
    const int64_t width = c_.v4->hc_mult * c_.hidden_size;
    f32_nd(w, stem + "_fn", {mixes, width}, std::sqrt(3.0f / float(width)), 0.0f);
    f32_nd(w, stem + "_base", {mixes}, 0.5f, 0.0f);
    f32_nd(w, stem + "_scale", {scales}, 0.25f, 1.0f);
  }

  void v4_compressor(SafetensorsWriter& w, const std::string& p, int64_t d, int64_t ratio) {
    const int64_t c = ratio == 4 ? 2 : 1, H = c_.hidden_size;
    bf16_tensor(w, p + "wkv.weight", {c * d, H}, std::sqrt(3.0f / float(H)), 0.0f);
    bf16_tensor(w, p + "wgate.weight", {c * d, H}, std::sqrt(3.0f / float(H)), 0.0f);
    f32_nd(w, p + "ape", {ratio, c * d}, 0.5f, 0.0f);
    norm(w, p + "norm.weight", d);
  }

  void v4_block(SafetensorsWriter& w, const std::string& p, int64_t l) {
    const ModelConfig& c = c_;
    const V4Config& v = *c.v4;
    const int64_t H = c.hidden_size, nh = c.num_attention_heads, hcm = v.hc_mult;
    const int64_t qr = *c.q_lora_rank, dh = v.head_dim, ratio = v.ratio(l);
    norm(w, p + "attn_norm.weight", H);
    norm(w, p + "ffn_norm.weight", H);
    hc(w, p + "hc_attn", (2 + hcm) * hcm, 3);
    hc(w, p + "hc_ffn", (2 + hcm) * hcm, 3);
    const std::string a = p + "attn.";
    f32_nd(w, a + "attn_sink", {nh}, 1.0f, 0.0f);
    fp8_ue8m0(w, a + "wq_a", qr, H);
    norm(w, a + "q_norm.weight", qr);
    fp8_ue8m0(w, a + "wq_b", nh * dh, qr);
    fp8_ue8m0(w, a + "wkv", dh, H);
    norm(w, a + "kv_norm.weight", dh);
    fp8_ue8m0(w, a + "wo_a", v.o_groups * v.o_lora_rank, nh * dh / v.o_groups);
    fp8_ue8m0(w, a + "wo_b", H, v.o_groups * v.o_lora_rank);
    if (ratio != 0) v4_compressor(w, a + "compressor.", dh, ratio);
    if (ratio == 4) {
      const IndexerConfig& ix = *c.indexer;
      fp8_ue8m0(w, a + "indexer.wq_b", ix.n_heads * ix.head_dim, qr);
      bf16_tensor(w, a + "indexer.weights_proj.weight", {ix.n_heads, H}, std::sqrt(3.0f / float(H)),
                  0.0f);
      v4_compressor(w, a + "indexer.compressor.", ix.head_dim, 4);
    }
    const std::string f = p + "ffn.";
    const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size, k = c.num_experts_per_tok;
    bf16_tensor(w, f + "gate.weight", {E, H}, 4.0f * std::sqrt(3.0f / float(H)), 0.0f);
    if (l < v.num_hash_layers) {  // token id -> k distinct experts
      std::vector<int64_t> t(size_t(c.vocab_size * k));
      for (int64_t id = 0; id < c.vocab_size; ++id) {
        const int64_t first = int64_t(mix(seed_ ^ uint64_t(id * 131 + l)) % uint64_t(E));
        for (int64_t j = 0; j < k; ++j) t[size_t(id * k + j)] = (first + j * (E / k)) % E;
      }
      w.add(f + "gate.tid2eid", DType::kI64, {c.vocab_size, k}, t.data(), t.size() * 8);
    } else {
      f32_nd(w, f + "gate.bias", {E}, 0.05f, 0.05f);
    }
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = fmt::format("{}experts.{}.", f, e);
      if (v.fp4_experts) {
        fp4_ue8m0(w, ep + "w1", I, H);
        fp4_ue8m0(w, ep + "w3", I, H);
        fp4_ue8m0(w, ep + "w2", H, I);
      } else {
        fp8_ue8m0(w, ep + "w1", I, H);
        fp8_ue8m0(w, ep + "w3", I, H);
        fp8_ue8m0(w, ep + "w2", H, I);
      }
    }
    fp8_ue8m0(w, f + "shared_experts.w1", I, H);
    fp8_ue8m0(w, f + "shared_experts.w3", I, H);
    fp8_ue8m0(w, f + "shared_experts.w2", H, I);
  }

  void v4_mtp(SafetensorsWriter& w) {
    const int64_t H = c_.hidden_size;
    const std::string p = "mtp.0.";
    v4_block(w, p, c_.num_hidden_layers);
    fp8_ue8m0(w, p + "e_proj", H, H);
    fp8_ue8m0(w, p + "h_proj", H, H);
    norm(w, p + "enorm.weight", H);
    norm(w, p + "hnorm.weight", H);
    norm(w, p + "norm.weight", H);
    hc(w, p + "hc_head", c_.v4->hc_mult, 1);
  }

  void v4_head(SafetensorsWriter& w) {
    norm(w, "norm.weight", c_.hidden_size);
    bf16_tensor(w, "head.weight", {c_.vocab_size, c_.hidden_size},
                std::sqrt(3.0f / float(c_.hidden_size)), 0.0f);
    hc(w, "hc_head", c_.v4->hc_mult, 1);
  }

  void layer(SafetensorsWriter& w, int64_t l) {
    const ModelConfig& c = c_;
    const int64_t H = c.hidden_size, nh = c.num_attention_heads;
    std::string p = fmt::format("model.layers.{}.", l);
    norm(w, p + "input_layernorm.weight", H);
    norm(w, p + "post_attention_layernorm.weight", H);
    std::string a = p + "self_attn.";
    if (c.q_lora_rank) {
      fp8_linear(w, a + "q_a_proj.weight", *c.q_lora_rank, H);
      norm(w, a + "q_a_layernorm.weight", *c.q_lora_rank);
      fp8_linear(w, a + "q_b_proj.weight", nh * c.qk_head_dim(), *c.q_lora_rank);
    } else {
      fp8_linear(w, a + "q_proj.weight", nh * c.qk_head_dim(), H);
    }
    fp8_linear(w, a + "kv_a_proj_with_mqa.weight", c.kv_cache_dim(), H);
    norm(w, a + "kv_a_layernorm.weight", c.kv_lora_rank);
    fp8_linear(w, a + "kv_b_proj.weight", nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
    fp8_linear(w, a + "o_proj.weight", H, nh * c.v_head_dim);
    if (c.indexer) {  // as released: FP8 projections, BF16 weights_proj, a LayerNorm with bias
      const std::string ix = a + "indexer.";
      const int64_t d = c.indexer->head_dim, ih = c.indexer->n_heads;
      fp8_linear(w, ix + "wq_b.weight", ih * d, *c.q_lora_rank);
      fp8_linear(w, ix + "wk.weight", d, H);
      norm(w, ix + "k_norm.weight", d);
      bf16_tensor(w, ix + "k_norm.bias", {d}, 0.1f, 0.0f);
      bf16_tensor(w, ix + "weights_proj.weight", {ih, H}, std::sqrt(3.0f / float(H)), 0.0f);
    }
    if (!c.is_moe_layer(l)) {
      mlp(w, p + "mlp", H, c.intermediate_size);
      return;
    }
    // A strong gate so that routing is decisive rather than near-uniform.
    bf16_tensor(w, p + "mlp.gate.weight", {c.n_routed_experts, H},
                4.0f * std::sqrt(3.0f / float(H)), 0.0f);
    if (c.topk_method == TopkMethod::kNoauxTc) {
      f32_tensor(w, p + "mlp.gate.e_score_correction_bias", c.n_routed_experts, 0.0f, 0.1f);
    }
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      mlp(w, fmt::format("{}mlp.experts.{}", p, e), H, c.moe_intermediate_size);
    }
    if (c.n_shared_experts > 0) {
      mlp(w, p + "mlp.shared_experts", H, c.moe_intermediate_size * c.n_shared_experts);
    }
  }

 private:
  const ModelConfig& c_;
  uint64_t seed_;
  ThreadPool* pool_;
};

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return IOError(path.string() + ": write failed");
  return Status::Ok();
}

}  // namespace

std::vector<std::string> make_model_presets() {
  return {"tiny", "bench", "v2-lite-tiny", "v32-tiny", "v4-tiny", "v4-flash-bench"};
}

Result<ModelConfig> make_model_config(const MakeModelOptions& o) {
  json j = preset_json(o.preset);
  if (j.is_null()) {
    return InvalidArgument(fmt::format("unknown preset '{}' (known: {})", o.preset,
                                       fmt::join(make_model_presets(), ", ")));
  }
  for (const std::string& kv : o.overrides) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgument(fmt::format("--set '{}': expected key=value", kv));
    }
    std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    json v = json::parse(value, nullptr, false);
    j[key] = v.is_discarded() ? json(value) : v;  // bare words are strings
  }
  j["quantization_config"] = {{"quant_method", "fp8"},
                              {"fmt", "e4m3"},
                              {"activation_scheme", "dynamic"},
                              {"weight_block_size", {128, 128}}};
  if (j.value("model_type", "") == "deepseek_v4") j["quantization_config"]["scale_fmt"] = "ue8m0";
  return parse_model_config(j.dump(), "preset " + o.preset);
}

Result<uint64_t> make_model(const MakeModelOptions& o, const std::string& out_dir,
                            ThreadPool* pool) {
  ASSIGN_OR_RETURN(ModelConfig c, make_model_config(o));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return IOError(fmt::format("{}: cannot create directory: {}", out_dir, ec.message()));
  ModelWriter mw(c, o.seed, pool);

  // Shard by layer ranges: embed + first layers, ..., last layers + norm + lm_head.
  const int64_t L = c.num_hidden_layers;
  int shards =
      o.shards > 0 ? o.shards : int(std::max<int64_t>(2, std::min<int64_t>(L, (L + 2) / 3)));
  shards = int(std::min<int64_t>(shards, L));
  shards = std::max(shards, 1);
  json weight_map = json::object();
  uint64_t total = 0;
  for (int s = 0; s < shards; ++s) {
    SafetensorsWriter w;
    w.set_metadata("format", "pt");
    if (c.v4) {  // DeepSeek's own names
      if (s == 0) mw.bf16_tensor(w, "embed.weight", {c.vocab_size, c.hidden_size}, 1.0f, 0.0f);
      for (int64_t l = L * s / shards; l < L * (s + 1) / shards; ++l) {
        mw.v4_block(w, fmt::format("layers.{}.", l), l);
      }
      if (s == shards - 1) {
        if (c.num_nextn_predict_layers > 0) mw.v4_mtp(w);
        mw.v4_head(w);
      }
    } else if (s == 0) {
      mw.bf16_tensor(w, "model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, 1.0f, 0.0f);
    }
    for (int64_t l = L * s / shards; l < L * (s + 1) / shards && !c.v4; ++l) mw.layer(w, l);
    if (s == shards - 1 && !c.v4) {
      if (c.num_nextn_predict_layers > 0) mw.mtp(w);
      mw.norm(w, "model.norm.weight", c.hidden_size);
      if (!c.tie_word_embeddings) {
        mw.bf16_tensor(w, "lm_head.weight", {c.vocab_size, c.hidden_size},
                       std::sqrt(3.0f / float(c.hidden_size)), 0.0f);
      }
    }
    std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
    RETURN_IF_ERROR(w.write((fs::path(out_dir) / file).string()));
    total += w.data_bytes();
    for (const std::string& name : w.names()) weight_map[name] = file;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  RETURN_IF_ERROR(
      write_text(fs::path(out_dir) / "model.safetensors.index.json", index.dump(2) + "\n"));
  RETURN_IF_ERROR(write_text(fs::path(out_dir) / "config.json", model_config_to_json(c)));
  if (!o.tokenizer_dir.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(fs::path(o.tokenizer_dir) / f, fs::path(out_dir) / f,
                    fs::copy_options::overwrite_existing, ec);
      if (ec)
        return IOError(fmt::format("copying {} from {}: {}", f, o.tokenizer_dir, ec.message()));
    }
    if (c.indexer || c.v4) {  // V3.2 and V4 ship no chat template: their encoders render chats
      const fs::path path = fs::path(out_dir) / "tokenizer_config.json";
      std::ifstream in(path, std::ios::binary);
      auto cfg = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (cfg.is_discarded()) return IOError(path.string() + ": not valid JSON");
      cfg.erase("chat_template");
      RETURN_IF_ERROR(write_text(path, cfg.dump(2) + "\n"));
    }
  }
  return total;
}

}  // namespace moeserve
