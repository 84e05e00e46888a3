#include "e2e_bench.h"

#include <chrono>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cache/kv_cache.h"
#include "ep/dispatcher.h"
#include "kernels/sampling.h"
#include "model/loaded_model.h"

namespace moeserve::bench {

namespace {

double view_bytes(const WeightView& w) {
  double b = double(w.rows) * double(w.cols) * double(dtype_size(w.dtype));
  if (w.dtype == DType::kF8E4M3) {
    b += double((w.rows + w.block_rows - 1) / w.block_rows) * double(w.scale_cols()) * 4.0;
  }
  return b;
}
// As gemm_int8 stores it: a byte per weight, an F32 scale per column and 128-wide K block.
double int8_bytes(const WeightView& w) {
  return double(w.rows) * double(w.cols) +
         4.0 * double((w.rows + 63) / 64 * 64) * double((w.cols + 127) / 128);
}
// As gemm_int4 stores it: half a byte per weight, two F32 (scale, minimum) per column and block.
double int4_bytes(const WeightView& w) {
  return 0.5 * double(w.rows) * double(w.cols) +
         8.0 * double((w.rows + 63) / 64 * 64) * double((w.cols + 127) / 128);
}
// A projection as the fast path holds it in `format`.
double proj_bytes(const WeightView& w, WeightFormat format) {
  if (w.dtype != DType::kF8E4M3) return view_bytes(w);
  return format == WeightFormat::kInt8   ? int8_bytes(w)
         : format == WeightFormat::kInt4 ? int4_bytes(w)
                                         : view_bytes(w);
}
double proj_bytes(const WeightView& w, const WeightFormats& formats) {
  return proj_bytes(w, formats.projections);
}
double mlp_bytes(const MlpWeights& m, WeightFormat format) {
  return proj_bytes(m.gate, format) + proj_bytes(m.up, format) + proj_bytes(m.down, format);
}
double mlp_bytes(const MlpWeights& m, const WeightFormats& formats) {
  return mlp_bytes(m, formats.projections);
}

// Bytes one decode step at batch 1 must read: every non-expert weight, top-k experts per MoE
// layer (taking the average expert size), one embedding row, and the KV of `context` tokens.
double bytes_per_token(const ModelConfig& c, const ModelWeights& w, int64_t context,
                       const WeightFormats& formats) {
  const double head = formats.lm_head == HeadFormat::kInt8   ? int8_bytes(w.lm_head)
                      : formats.lm_head == HeadFormat::kInt4 ? int4_bytes(w.lm_head)
                                                             : view_bytes(w.lm_head);
  double b = double(w.embed.cols) * double(dtype_size(w.embed.dtype)) + head;
  for (const LayerWeights& L : w.layers) {
    const AttentionWeights& A = L.attn;
    if (A.q_a) b += proj_bytes(*A.q_a, formats);
    // (kv_b_proj stays FP8 for the absorbed attention's F32 GEMMs.)
    b += proj_bytes(A.q_b, formats) + proj_bytes(A.kv_a, formats) + view_bytes(A.kv_b) +
         proj_bytes(A.o, formats);
    if (L.mlp) b += mlp_bytes(*L.mlp, formats);
    if (L.moe) {
      b += view_bytes(L.moe->gate);
      if (L.moe->shared) b += mlp_bytes(*L.moe->shared, formats);
      double experts = 0;
      int n = 0;
      for (const auto& e : L.moe->experts) {
        if (e) experts += mlp_bytes(*e, formats.expert_format()), ++n;
      }
      if (n > 0) b += experts / n * double(c.num_experts_per_tok);
    }
  }
  b += double(context) * double(c.kv_cache_dim()) * 2.0 * double(c.num_hidden_layers);
  return b;
}

}  // namespace

int run_e2e_bench(const E2eOptions& o, const Ceilings& ceil, const ThreadPool& pool) {
  const int64_t total = o.prompt_tokens + o.decode_tokens;
  ModelOptions mo;  // the served defaults: fast path, absorbed attention, BF16 latent cache
  mo.model_dir = o.model_dir;
  mo.threads = pool.size();
  mo.formats = o.formats;
  mo.kv_blocks = blocks_for(total);
  auto loaded = LoadedModel::open(mo);
  if (!loaded.ok()) {
    fmt::print(stderr, "e2e: {}\n", loaded.status().message());
    return 1;
  }
  const ModelConfig& c = (*loaded)->config();
  CausalLm& model = (*loaded)->model();
  KvCache& cache = (*loaded)->cache();
  std::vector<int32_t> table;
  for (int32_t b = 0; int64_t(b) * kKvBlockSize < total; ++b) table.push_back(b);
  std::vector<int32_t> tokens;
  for (int i = 0; i < o.prompt_tokens; ++i)
    tokens.push_back(int32_t((i * 7919 + 17) % c.vocab_size));
  StepOutput out;
  std::vector<float>& logits = out.logits;
  StepSequence prefill{tokens, 0, table, 1};
  if (Status st = model.forward({&prefill, 1}, cache, &out); !st.ok()) {
    fmt::print(stderr, "e2e: {}\n", st.message());
    return 1;
  }
  tokens.push_back(argmax(logits.data(), c.vocab_size));
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.decode_tokens; ++i) {
    StepSequence step{std::span<const int32_t>(tokens).subspan(tokens.size() - 1, 1),
                      int64_t(tokens.size()) - 1, table, 1};
    if (Status st = model.forward({&step, 1}, cache, &out); !st.ok()) {
      fmt::print(stderr, "e2e: {}\n", st.message());
      return 1;
    }
    tokens.push_back(argmax(logits.data(), c.vocab_size));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double tps = o.decode_tokens / secs;
  double bytes = bytes_per_token(c, (*loaded)->checkpoint().weights(),
                                 o.prompt_tokens + o.decode_tokens / 2, o.formats);
  double roofline = ceil.dram_read_gbps * 1e9 / bytes;
  if (o.json) {
    nlohmann::ordered_json j = {{"kernel", "e2e"},
                                {"model", o.model_dir},
                                {"batch", 1},
                                {"tokens_per_s", tps},
                                {"roofline_tokens_per_s", roofline},
                                {"roofline_ratio", tps / roofline},
                                {"bytes_per_token", bytes},
                                {"projection_dtype", weight_format_name(o.formats.projections)},
                                {"lm_head_dtype", head_format_name(o.formats.lm_head)},
                                {"expert_dtype", weight_format_name(o.formats.expert_format())},
                                {"dram_read_gbps", ceil.dram_read_gbps}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print(
        "e2e batch 1: {:.2f} tokens/s, roofline {:.2f} tokens/s ({:.1f} MB/token at "
        "{:.1f} GB/s): {:.0f}%\n",
        tps, roofline, bytes / 1e6, ceil.dram_read_gbps, 100 * tps / roofline);
  }
  return 0;
}

}  // namespace moeserve::bench
