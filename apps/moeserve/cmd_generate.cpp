// moeserve generate --model DIR --prompt-ids 0,5,9 [--prompt-ids ...] [--max-tokens N] ...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cache/disk_tier.h"
#include "cache/kv_cache.h"
#include "commands.h"
#include "core/thread_pool.h"
#include "core/trace.h"
#include "engine/generator.h"
#include "ep/dispatcher.h"
#include "ep/ep_group.h"
#include "ep/expert_load_counter.h"
#include "ep_flags.h"
#include "eplb/expert_loads.h"
#include "front_door.h"
#include "model/expert_store.h"
#include "model/loaded_model.h"
#include "spec_flags.h"
#include "tokenizer/chat_messages_json.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {

namespace {

struct GenerateOptions {
  std::string model;
  std::vector<std::string> prompt_ids;
  std::vector<std::string> prompts;         // text, encoded with the tokenizer
  std::vector<std::string> messages_files;  // chat messages (JSON), rendered with the template
  std::string tokenizer;                    // default: the model directory
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
  DType kv_dtype = DType::kBF16;
  std::string kv_disk;  // the KV cache's disk tier (empty: none)
  double kv_disk_gb = 0;
  std::string compute = "fast";
  WeightFormats formats;
  std::string weight_cache;
  std::string trace;  // Chrome trace JSON output (per rank under EP: FILE.rank<r>.json)
  int64_t prefill_chunk = 0;
  std::optional<int64_t> kv_window_blocks;  // the window pool's pages (unset: sized here)
  // Expert parallelism and EPLB (under mpirun or with --ep): every rank runs the same prompts
  // (DP attention is `serve`'s), rank 0 prints.
  EpFlags ep;
  SpecFlags spec;  // MTP speculative decoding
};

// Rank 0, --eplb-interval: median step time against the slowest step that moved weights.
void print_step_times(std::vector<double> ms, const std::vector<bool>& migrating) {
  if (ms.empty()) return;
  double worst = 0, worst_other = 0;
  int64_t n_mig = 0;
  for (size_t i = 0; i < ms.size(); ++i) {
    if (!migrating[i]) {
      if (i > 0) worst_other = std::max(worst_other, ms[i]);  // step 0 is the prefill
      continue;
    }
    worst = std::max(worst, ms[i]);
    ++n_mig;
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  fmt::print(stderr,
             "eplb: {} steps, median {:.1f} ms; {} steps moved expert weights, the slowest "
             "{:.1f} ms ({:.2f}x the median); slowest other decode step {:.1f} ms ({:.2f}x)\n",
             ms.size(), median, n_mig, worst, median > 0 ? worst / median : 0.0, worst_other,
             median > 0 ? worst_other / median : 0.0);
  if (std::getenv("MOESERVE_EPLB_STEP_TIMES")) {  // every step, for the figures of docs/eplb.md
    std::string all;
    for (size_t i = 0; i < ms.size(); ++i)
      all += fmt::format(" {:.0f}{}", ms[i], migrating[i] ? "*" : "");
    fmt::print(stderr, "eplb: step ms (* = moved weights):{}\n", all);
  }
}

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

// Prompts as token ids: --prompt-ids as given, --prompt encoded (with BOS as the tokenizer's
// config says), --messages rendered with the chat template (generation prompt added).
Result<std::vector<std::vector<int32_t>>> collect_prompts(const GenerateOptions& o,
                                                          const std::optional<Tokenizer>& tok) {
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : o.prompt_ids) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_ids(p));
    prompts.push_back(std::move(ids));
  }
  if ((!o.prompts.empty() || !o.messages_files.empty()) && !tok) {
    return InvalidArgument("--prompt and --messages need a tokenizer (--tokenizer DIR)");
  }
  for (const std::string& text : o.prompts)
    prompts.push_back(tok->encode(text, tok->default_add_bos()));
  if (!o.messages_files.empty()) {
    ASSIGN_OR_RETURN(ChatTemplate chat, chat_template_for(*tok, o.model));
    for (const std::string& file : o.messages_files) {
      std::ifstream in(file, std::ios::binary);
      if (!in) return NotFound(file + ": cannot open");
      std::stringstream ss;
      ss << in.rdbuf();
      auto messages = parse_messages_json(ss.str());
      if (!messages.ok()) return messages.status().with_context(file);
      ASSIGN_OR_RETURN(std::string text, chat.render(*messages, /*add_generation_prompt=*/true));
      prompts.push_back(tok->encode(text, /*add_bos=*/false));  // the template writes BOS
    }
  }
  return prompts;
}

// stdout: one line per prompt (JSON with --json: ids, tokens, text, top logprobs).
void print_results(const GenerateOptions& o, const std::vector<GenerateRequest>& requests,
                   const std::vector<GenerateResult>& results, const std::optional<Tokenizer>& tok,
                   int64_t vocab_size) {
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerateResult& r = results[i];
    if (o.json) {
      nlohmann::json j;
      j["prompt_ids"] = requests[i].prompt;
      j["tokens"] = r.tokens;
      j["finish_reason"] = r.finish == FinishReason::kStop ? "stop" : "length";
      if (o.spec.enabled()) {
        j["draft_tokens"] = r.draft_tokens;
        j["accepted_draft_tokens"] = r.accepted_draft_tokens;
      }
      if (tok && tok->vocab_size() <= vocab_size) j["text"] = tok->decode(r.tokens, true);
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
      if (tok && tok->vocab_size() <= vocab_size) {
        fmt::print("prompt {}: {}\n", i, tok->decode(r.tokens, true));
      } else {
        fmt::print("prompt {}: {}\n", i, fmt::join(r.tokens, " "));
      }
    }
  }
}

// --speculative: acceptance per draft position on stderr (and as JSON with --json).
void print_speculative(const GenerateOptions& o, const EngineCoreStats& s, double tokens_per_s) {
  std::string per_pos;
  for (int64_t k = 0; k < o.spec.num_draft_tokens; ++k) {
    const double v = double(s.spec_verified[size_t(k)]);
    per_pos += fmt::format(" {:.3f}", v > 0 ? double(s.spec_accepted[size_t(k)]) / v : 0.0);
  }
  const double steps = double(std::max<int64_t>(1, s.spec_verify_steps));
  fmt::print(stderr,
             "speculative: acceptance per draft position{}, {:.3f} tokens per verify step, "
             "{} of {} steps without drafts (load policy)\n",
             per_pos, double(s.spec_verify_tokens) / steps, s.spec_off_steps, s.steps);
  if (o.json) {
    nlohmann::json j;
    j["speculative"] = {
        {"num_draft_tokens", o.spec.num_draft_tokens},
        {"verified", std::vector<int64_t>(s.spec_verified.begin(),
                                          s.spec_verified.begin() + o.spec.num_draft_tokens)},
        {"accepted", std::vector<int64_t>(s.spec_accepted.begin(),
                                          s.spec_accepted.begin() + o.spec.num_draft_tokens)},
        {"verify_steps", s.spec_verify_steps},
        {"verify_tokens", s.spec_verify_tokens},
        {"steps", s.steps},
        {"off_steps", s.spec_off_steps},
        {"tokens_per_s", tokens_per_s}};
    fmt::print("{}\n", j.dump());
  }
}

// The bring-up's options from the flags; the KV cache holds every prompt with all its tokens.
ModelOptions model_options(const GenerateOptions& o, const std::vector<GenerateRequest>& requests,
                           bool progress) {
  ModelOptions mo;
  mo.model_dir = o.model;
  mo.threads = o.threads;
  mo.compute = o.compute == "reference" ? ComputePath::kReference : ComputePath::kFast;
  mo.attention = o.attention == "naive"         ? AttentionMode::kNaive
                 : o.attention == "mha-prefill" ? AttentionMode::kMhaPrefill
                                                : AttentionMode::kAbsorbed;
  mo.formats = o.formats;
  mo.weight_cache_dir = o.weight_cache;
  mo.kv_dtype = o.kv_dtype;
  int64_t n_blocks = 0;
  for (const auto& r : requests) n_blocks += blocks_for(int64_t(r.prompt.size()) + r.max_tokens);
  mo.kv_blocks = n_blocks;
  // The window pool (V4's sliding windows): what the requests' steps write, twice over; with
  // the whole batch prefilled at once, one page per block.
  mo.kv_window_blocks = o.kv_window_blocks;
  mo.kv_window_seqs = int64_t(requests.size());
  mo.kv_window_tokens =
      o.prefill_chunk > 0 ? o.prefill_chunk * int64_t(requests.size()) : n_blocks * kKvBlockSize;
  mo.kv_disk_dir = o.kv_disk;
  mo.kv_disk_gb = o.kv_disk_gb;
  mo.mtp = o.spec.enabled();
  mo.overlap = !o.ep.no_overlap;
  mo.overlap_min_tokens = o.ep.overlap_min_tokens;
  mo.progress = progress;
  return mo;
}

// Under mpirun or --ep: this rank's place in the EP group, sized for the largest step (every
// prompt at once, or every draft).
Result<EpGroup> join_group(const GenerateOptions& o, const std::vector<GenerateRequest>& requests) {
  ASSIGN_OR_RETURN(ModelConfig config, load_model_config(o.model + "/config.json"));
  int64_t max_tokens = 0;
  for (const auto& r : requests) {
    max_tokens += int64_t(r.prompt.size()) + 1 + (o.spec.enabled() ? o.spec.num_draft_tokens : 0);
  }
  return join_ep_group(o.ep, config, max_tokens, /*bf16_rows=*/o.compute != "reference",
                       /*mtp=*/o.spec.enabled());
}

int run_generate(const GenerateOptions& o) {
  // The tokenizer: --tokenizer, else the model directory when it has one.
  std::optional<Tokenizer> tok;
  std::string tok_dir = o.tokenizer.empty() ? o.model : o.tokenizer;
  if (!o.tokenizer.empty() ||
      std::filesystem::exists(std::filesystem::path(tok_dir) / "tokenizer.json")) {
    auto t = Tokenizer::load(tok_dir);
    if (!t.ok()) {
      fmt::print(stderr, "generate: {}\n", t.status().message());
      return 1;
    }
    tok = std::move(*t);
  }
  auto prompts = collect_prompts(o, tok);
  if (!prompts.ok()) {
    fmt::print(stderr, "generate: {}\n", prompts.status().message());
    return prompts.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::vector<GenerateRequest> requests;
  for (auto& ids : *prompts) {
    GenerateRequest r;
    r.prompt = std::move(ids);
    r.max_tokens = o.max_tokens;
    r.sampling = {o.temperature, o.top_p, o.top_k};
    r.seed = o.seed;
    r.top_logprobs = o.logprobs;
    r.ignore_eos = o.ignore_eos;
    requests.push_back(std::move(r));
  }
  if (requests.empty()) {
    fmt::print(stderr, "generate: give at least one --prompt-ids, --prompt or --messages\n");
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();
  std::optional<EpGroup> ep;
  if (std::string usage = check_ep_flags(o.ep); !usage.empty()) {
    fmt::print(stderr, "generate: {}\n", usage);
    return 2;
  }
  if (o.ep.enabled()) {
    auto group = join_group(o, requests);
    if (!group.ok()) {
      fmt::print(stderr, "generate: {}\n", group.status().message());
      return 1;
    }
    ep = std::move(*group);
  }
  const bool print = !ep || ep->comm->rank() == 0;
  auto loaded =
      LoadedModel::open(model_options(o, requests, print), ep ? ep->dispatcher.get() : nullptr);
  if (!loaded.ok()) {
    fmt::print(stderr, "generate: {}\n", loaded.status().message());
    return 1;
  }
  const ModelConfig& c = (*loaded)->config();
  CausalLm& model = (*loaded)->model();
  KvCache& cache = (*loaded)->cache();
  ThreadPool& pool = (*loaded)->pool();
  DiskTier* disk = (*loaded)->disk();
  const double load_s = seconds_since(t0);  // the checkpoint mapped and its weights prepared
  const SpeculativeConfig spec = o.spec.config();
  Generator gen(model, cache, &pool, spec);
  const int rank = ep ? ep->comm->rank() : 0;
  std::optional<Tracer> tracer;
  if (!o.trace.empty()) {
    tracer.emplace(rank);
    model.set_tracer(&*tracer);
  }
  // Online EPLB: the balancer moves weights through the model after every step; the step
  // times (forward + balancer) show what a migration costs.
  std::vector<double> step_ms;
  std::vector<bool> step_migrating;
  auto step_t0 = std::chrono::steady_clock::now();
  if (ep && ep->balancer) {
    if (o.ep.eplb_interval > 0)
      ep->balancer->set_expert_host(std::make_unique<ModelExpertHost>(model.experts()));
    gen.set_after_step([&]() -> Status {
      const bool started = ep->balancer->migrating();
      Result<bool> r = ep->balancer->end_step();
      step_migrating.push_back(started || ep->balancer->migrating());
      step_ms.push_back(seconds_since(step_t0) * 1000);
      step_t0 = std::chrono::steady_clock::now();
      return r.status();
    });
  }

  auto t1 = std::chrono::steady_clock::now();
  step_t0 = t1;
  auto results = gen.generate(requests, o.prefill_chunk);
  if (!results.ok()) {
    fmt::print(stderr, "generate{}: {}\n", ep ? fmt::format(" (rank {})", ep->comm->rank()) : "",
               results.status().message());
    return 1;
  }
  double gen_s = seconds_since(t1);
  if (disk && print) {
    disk->flush();
    const DiskTierStats s = disk->stats();
    std::string rejected;
    for (int r = 0; r < kDiskRejectKinds; ++r) {
      if (s.rejected[size_t(r)] > 0) {
        rejected += fmt::format(" {} {}", to_string(DiskReject(r)), s.rejected[size_t(r)]);
      }
    }
    fmt::print(stderr, "kv-disk: {} hits, {} misses, rejected:{}, {} written, {} dropped\n", s.hits,
               s.misses, rejected.empty() ? " none" : rejected, s.written, s.write_drops);
  }
  if (ep && ep->balancer && o.ep.eplb_interval > 0 && print)
    print_step_times(step_ms, step_migrating);
  if (ep && ep->balancer) {
    if (Status st = report_expert_loads(*ep, o.ep.expert_stats_out); !st.ok()) {
      fmt::print(stderr, "generate: {}\n", st.message());
      return 1;
    }
  }
  if (tracer) {
    std::string path = ep ? fmt::format("{}.rank{}.json", o.trace, rank) : o.trace;
    if (Status st = tracer->write(path); !st.ok()) {
      fmt::print(stderr, "generate: {}\n", st.message());
      return 1;
    }
  }
  if (!print) return 0;
  int64_t n_gen = 0;
  for (const GenerateResult& r : *results) n_gen += int64_t(r.tokens.size());
  print_results(o, requests, *results, tok, c.vocab_size);
  fmt::print(stderr, "generate: load {:.2f} s, {} tokens in {:.2f} s ({:.1f} tokens/s, batch {})\n",
             load_s, n_gen, gen_s, double(n_gen) / gen_s, requests.size());
  if (o.spec.enabled()) print_speculative(o, gen.stats(), double(n_gen) / gen_s);
  return 0;
}

}  // namespace

Subcommand add_generate_command(CLI::App& parent) {
  auto* app = parent.add_subcommand("generate", "Generate tokens from a checkpoint");
  auto o = std::make_shared<GenerateOptions>();
  app->add_option("--model", o->model, "Checkpoint directory (HF layout)")->required();
  app->add_option("--prompt-ids", o->prompt_ids,
                  "Comma-separated token ids of one prompt (repeat for a batch)");
  app->add_option("--prompt", o->prompts, "Prompt text (repeat for a batch)");
  app->add_option("--messages", o->messages_files,
                  "Chat messages JSON file, rendered with the chat template (repeat for a batch)");
  app->add_option("--tokenizer", o->tokenizer,
                  "Tokenizer directory (default: the model directory)");
  app->add_option("--max-tokens", o->max_tokens, "Tokens to generate per prompt")
      ->capture_default_str();
  app->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  app->add_option("--top-p", o->top_p)->capture_default_str();
  app->add_option("--top-k", o->top_k, "0 = all")->capture_default_str();
  app->add_option("--seed", o->seed)->capture_default_str();
  app->add_option("--logprobs", o->logprobs, "Record the top K logprobs per step")
      ->capture_default_str();
  app->add_flag("--json", o->json, "One JSON line per prompt");
  app->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the end-of-sequence token");
  app->add_option("--threads", o->threads, "Threads (default: all cores)");
  app->add_option("--attention", o->attention,
                  "absorbed | naive | mha-prefill (fast path: absorbed, and long prefill steps in "
                  "MHA form, DeepSeek's prefill form: docs/kernels-mla.md)")
      ->check(CLI::IsMember({"absorbed", "naive", "mha-prefill"}))
      ->capture_default_str();
  app->add_option("--kv-disk", o->kv_disk,
                  "Directory of the KV cache's disk tier: prompts whose 64-token blocks are there "
                  "are not recomputed (shared by every process using it; survives restarts)");
  app->add_option("--kv-disk-gb", o->kv_disk_gb, "Size bound of --kv-disk (0: none)")
      ->check(CLI::NonNegativeNumber);
  add_kv_cache_dtype_option(*app, o->kv_dtype);
  add_format_flags(*app, o->formats);
  add_weight_cache_flag(*app, o->weight_cache);
  app->add_option("--trace", o->trace,
                  "Write a Chrome trace (Perfetto, chrome://tracing) of every layer's stages");
  app->add_option("--compute", o->compute,
                  "fast (BF16 activations, SIMD kernels) | reference (FP32, scalar)")
      ->check(CLI::IsMember({"fast", "reference"}))
      ->capture_default_str();
  app->add_option("--prefill-chunk", o->prefill_chunk, "Max prompt tokens per step (0 = all)");
  app->add_option("--kv-window-blocks", o->kv_window_blocks,
                  "Pages of the sliding-window pool (V4: window entries of the blocks a step "
                  "reads; default: sized from the requests and --prefill-chunk)")
      ->check(CLI::PositiveNumber);
  add_ep_flags(*app, o->ep);
  add_spec_flags(*app, o->spec);
  return {app, [o] { return run_generate(*o); }};
}

}  // namespace moeserve::cli
