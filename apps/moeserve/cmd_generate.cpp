// moeserve generate --model DIR --prompt-ids 0,5,9 [--prompt-ids ...] [--max-tokens N] ...
#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cache/block_allocator.h"
#include "cache/latent_cache.h"
#include "commands.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "ep/dispatcher.h"
#include "model/checkpoint.h"
#include "model/deepseek.h"

namespace moeserve::cli {

namespace {

struct GenerateOptions {
  std::string model;
  std::vector<std::string> prompt_ids;
  int64_t max_tokens = 16;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int64_t top_k = 0;
  uint64_t seed = 0;
  int64_t logprobs = 0;
  bool json = false;
  bool ignore_eos = false;
  int threads = 0;
  std::string attention = "absorbed";
  std::string kv_dtype = "bf16";
  std::string compute = "fast";
  int64_t prefill_chunk = 0;
};

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX) {
      return InvalidArgument(fmt::format("--prompt-ids '{}': '{}' is not a token id", text, item));
    }
    ids.push_back(int32_t(v));
    i = j + 1;
  }
  return ids;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int run_generate(const GenerateOptions& o) {
  std::vector<GenerateRequest> requests;
  for (const std::string& p : o.prompt_ids) {
    Result<std::vector<int32_t>> ids = parse_ids(p);
    if (!ids.ok()) {
      fmt::print(stderr, "generate: {}\n", ids.status().message());
      return 2;
    }
    GenerateRequest r;
    r.prompt = std::move(*ids);
    r.max_tokens = o.max_tokens;
    r.sampling = {o.temperature, o.top_p, o.top_k};
    r.seed = o.seed;
    r.top_logprobs = o.logprobs;
    r.ignore_eos = o.ignore_eos;
    requests.push_back(std::move(r));
  }
  if (requests.empty()) {
    fmt::print(stderr, "generate: give at least one --prompt-ids\n");
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();
  LoadOptions load;
  load.progress = true;
  auto ck = Checkpoint::open(o.model, load);
  if (!ck.ok()) {
    fmt::print(stderr, "generate: {}\n", ck.status().message());
    return 1;
  }
  const ModelConfig& c = (*ck)->config();
  double load_s = seconds_since(t0);

  ThreadPool pool(o.threads);
  LocalDispatcher dispatcher(c.n_routed_experts);
  DeepseekModel model(c, (*ck)->weights(), dispatcher, &pool,
                      o.attention == "naive" ? AttentionMode::kNaive : AttentionMode::kAbsorbed,
                      o.compute == "reference" ? ComputePath::kReference : ComputePath::kFast);
  int32_t n_blocks = 0;
  for (const auto& r : requests) n_blocks += blocks_for(int64_t(r.prompt.size()) + r.max_tokens);
  LatentKvCache cache(c.num_hidden_layers, c.kv_cache_dim(), n_blocks,
                      o.kv_dtype == "bf16" ? DType::kBF16 : DType::kF32);
  BlockAllocator blocks(n_blocks);
  Generator gen(model, cache, blocks);

  auto t1 = std::chrono::steady_clock::now();
  auto results = gen.generate(requests, o.prefill_chunk);
  if (!results.ok()) {
    fmt::print(stderr, "generate: {}\n", results.status().message());
    return 1;
  }
  double gen_s = seconds_since(t1);
  int64_t n_gen = 0;
  for (size_t i = 0; i < results->size(); ++i) {
    const GenerateResult& r = (*results)[i];
    n_gen += int64_t(r.tokens.size());
    if (o.json) {
      nlohmann::json j;
      j["prompt_ids"] = requests[i].prompt;
      j["tokens"] = r.tokens;
      j["finish_reason"] = r.finish == FinishReason::kStop ? "stop" : "length";
      if (o.logprobs > 0) {
        nlohmann::json steps = nlohmann::json::array();
        for (const auto& step : r.top_logprobs) {
          nlohmann::json s = nlohmann::json::array();
          for (const TokenLogprob& t : step) s.push_back({{"id", t.id}, {"logprob", t.logprob}});
          steps.push_back(s);
        }
        j["top_logprobs"] = steps;
      }
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("prompt {}: {}\n", i, fmt::join(r.tokens, " "));
    }
  }
  fmt::print(stderr, "generate: load {:.2f} s, {} tokens in {:.2f} s ({:.1f} tokens/s, batch {})\n",
             load_s, n_gen, gen_s, double(n_gen) / gen_s, requests.size());
  return 0;
}

}  // namespace

Subcommand add_generate_command(CLI::App& parent) {
  auto* app = parent.add_subcommand("generate", "Generate tokens from a checkpoint");
  auto o = std::make_shared<GenerateOptions>();
  app->add_option("--model", o->model, "Checkpoint directory (HF layout)")->required();
  app->add_option("--prompt-ids", o->prompt_ids,
                  "Comma-separated token ids of one prompt (repeat for a batch)");
  app->add_option("--max-tokens", o->max_tokens, "Tokens to generate per prompt")->capture_default_str();
  app->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  app->add_option("--top-p", o->top_p)->capture_default_str();
  app->add_option("--top-k", o->top_k, "0 = all")->capture_default_str();
  app->add_option("--seed", o->seed)->capture_default_str();
  app->add_option("--logprobs", o->logprobs, "Record the top K logprobs per step")->capture_default_str();
  app->add_flag("--json", o->json, "One JSON line per prompt");
  app->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the end-of-sequence token");
  app->add_option("--threads", o->threads, "Threads (default: all cores)");
  app->add_option("--attention", o->attention, "absorbed | naive")
      ->check(CLI::IsMember({"absorbed", "naive"}))->capture_default_str();
  app->add_option("--kv-cache-dtype", o->kv_dtype, "f32 | bf16")
      ->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  app->add_option("--compute", o->compute,
                  "fast (BF16 activations, SIMD kernels) | reference (FP32, scalar)")
      ->check(CLI::IsMember({"fast", "reference"}))->capture_default_str();
  app->add_option("--prefill-chunk", o->prefill_chunk, "Max prompt tokens per step (0 = all)");
  return {app, [o] { return run_generate(*o); }};
}

}  // namespace moeserve::cli
