// `moeserve perplexity`: held-out nats per token and perplexity of a checkpoint over text files
// (each tokenized with the model's tokenizer, BOS before each, concatenated in the order given)
// or a JSON array of token ids, in windows of --window + 1 tokens: each window is one forward
// pass from position 0 whose logits at every position predict the next token, the full
// vocabulary's softmax (the evaluation tools/train_tiny.py runs in PyTorch, so the figures of
// assets/models/tiny-py/README.md can be reproduced here on any compute path or GEMM format).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cache/kv_cache.h"
#include "commands.h"
#include "model/loaded_model.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {
namespace {

struct PerplexityArgs {
  std::string model;
  std::string tokens_file;
  std::vector<std::string> text_files;
  int64_t window = 512;
  int64_t max_windows = 0;
  int threads = 0;
  std::string compute = "fast";
  DType kv_dtype = DType::kBF16;
  WeightFormats formats;
  std::string weight_cache;
  bool json = false;
  bool per_token = false;  // --json also lists every prediction's NLL
};

Result<std::vector<int32_t>> read_tokens(const PerplexityArgs& a) {
  std::vector<int32_t> ids;
  if (!a.tokens_file.empty()) {
    std::ifstream f(a.tokens_file);
    if (!f) return NotFound(fmt::format("{}: cannot open", a.tokens_file));
    auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_array()) {
      return InvalidArgument(fmt::format("{}: expected a JSON array of token ids", a.tokens_file));
    }
    for (const auto& v : j) {
      if (!v.is_number_integer()) {
        return InvalidArgument(fmt::format("{}: {} is not a token id", a.tokens_file, v.dump()));
      }
      ids.push_back(v.get<int32_t>());
    }
    return ids;
  }
  ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(a.model));
  const std::optional<int32_t> bos = tok.bos_id();
  for (const std::string& path : a.text_files) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return NotFound(fmt::format("{}: cannot open", path));
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (bos) ids.push_back(*bos);
    tok.encode_append(text, ids);
  }
  return ids;
}

int run_perplexity(const PerplexityArgs& a) {
  if (a.tokens_file.empty() == a.text_files.empty()) {
    fmt::print(stderr, "perplexity: give either --tokens or --text\n");
    return 2;
  }
  auto ids = read_tokens(a);
  if (!ids.ok()) {
    fmt::print(stderr, "perplexity: {}\n", ids.status().message());
    return 1;
  }
  auto config = load_model_config(a.model + "/config.json");  // (checks before the weights)
  if (!config.ok()) {
    fmt::print(stderr, "perplexity: {}\n", config.status().message());
    return 1;
  }
  const ModelConfig& c = *config;
  for (size_t i = 0; i < ids->size(); ++i) {
    if ((*ids)[i] < 0 || (*ids)[i] >= c.vocab_size) {
      fmt::print(stderr, "perplexity: token {} ({}) is outside the vocabulary (0..{})\n", i,
                 (*ids)[i], c.vocab_size - 1);
      return 1;
    }
  }
  if (a.window > c.max_position_embeddings) {
    fmt::print(stderr, "perplexity: --window {} is longer than the model's context ({} tokens)\n",
               a.window, c.max_position_embeddings);
    return 2;
  }
  int64_t windows = (int64_t(ids->size()) - 1) / a.window;
  if (a.max_windows > 0 && windows > a.max_windows) windows = a.max_windows;
  if (windows <= 0) {
    fmt::print(stderr, "perplexity: {} tokens: fewer than one window of {} + 1\n", ids->size(),
               a.window);
    return 1;
  }
  ModelOptions mo;
  mo.model_dir = a.model;
  mo.threads = a.threads;
  mo.compute = a.compute == "reference" ? ComputePath::kReference : ComputePath::kFast;
  mo.formats = a.formats;
  mo.weight_cache_dir = a.weight_cache;
  mo.kv_dtype = a.kv_dtype;
  mo.kv_blocks = blocks_for(a.window);
  auto loaded = LoadedModel::open(mo);
  if (!loaded.ok()) {
    fmt::print(stderr, "perplexity: {}\n", loaded.status().message());
    return 1;
  }
  CausalLm& model = (*loaded)->model();
  KvCache& cache = (*loaded)->cache();
  ThreadPool& pool = (*loaded)->pool();
  std::vector<int32_t> table;
  for (int32_t b = 0; int64_t(b) * kKvBlockSize < a.window; ++b) table.push_back(b);
  const int64_t V = c.vocab_size;
  double nll = 0;
  int64_t n = 0;
  std::vector<double> each;  // per_token
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    const std::span<const int32_t> in(ids->data() + w * a.window, size_t(a.window));
    StepSequence seq{in, 0, table, a.window, 0};
    StepOutput out;
    if (Status st = model.forward({&seq, 1}, cache, &out); !st.ok()) {
      fmt::print(stderr, "perplexity: window {}: {}\n", w, st.message());
      return 1;
    }
    // log softmax at every position, over the threads. Logits of exactly 0 (the rows a
    // compacted head leaves out: fast_path.cpp) are counted, not exponentiated one by one.
    std::vector<double> part(size_t(a.window));
    pool.parallel_for(a.window, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const float* l = &out.logits[size_t(p * V)];
        float mx = l[0];
        for (int64_t v = 1; v < V; ++v) mx = std::max(mx, l[v]);
        double sum = 0;
        int64_t zeros = 0;
        for (int64_t v = 0; v < V; ++v) {
          if (l[v] == 0.0f) {
            ++zeros;
          } else {
            sum += std::exp(double(l[v]) - double(mx));
          }
        }
        sum += double(zeros) * std::exp(-double(mx));
        const int32_t target = (*ids)[size_t(w * a.window + p + 1)];
        part[size_t(p)] = std::log(sum) - (double(l[target]) - double(mx));
      }
    });
    for (double v : part) nll += v;
    if (a.per_token) each.insert(each.end(), part.begin(), part.end());
    n += a.window;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double npt = nll / double(n);
  if (a.json) {
    nlohmann::json j{{"tokens", n},
                     {"windows", windows},
                     {"nats_per_token", npt},
                     {"perplexity", std::exp(npt)},
                     {"seconds", s}};
    if (a.per_token) j["nll"] = each;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print(
        "{} predictions in {} windows of {}: {:.4f} nats/token, perplexity {:.2f} ({:.1f} s)\n", n,
        windows, a.window, npt, std::exp(npt), s);
  }
  return 0;
}

}  // namespace

Subcommand add_perplexity_command(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "perplexity", "Held-out nats/token and perplexity of a checkpoint over text or token ids");
  auto a = std::make_shared<PerplexityArgs>();
  app->add_option("--model", a->model, "Checkpoint directory (with its tokenizer for --text)")
      ->required();
  app->add_option("--tokens", a->tokens_file, "A JSON array of token ids");
  app->add_option("--text", a->text_files,
                  "Text files, each tokenized with BOS before it, concatenated in this order");
  app->add_option("--window", a->window, "Tokens per window (each predicts the next)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--max-windows", a->max_windows, "Evaluate at most this many windows (0: all)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--threads", a->threads, "Threads (default: all cores)");
  app->add_option("--compute", a->compute, "fast | reference")
      ->check(CLI::IsMember({"fast", "reference"}))
      ->capture_default_str();
  add_kv_cache_dtype_option(*app, a->kv_dtype);
  add_format_flags(*app, a->formats);
  add_weight_cache_flag(*app, a->weight_cache);
  app->add_flag("--json", a->json, "One JSON object");
  app->add_flag("--per-token", a->per_token,
                "With --json: every prediction's NLL (nats), in order, as \"nll\"");
  return {app, [a] { return run_perplexity(*a); }};
}

}  // namespace moeserve::cli
