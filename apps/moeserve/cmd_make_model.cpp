// moeserve make-model --preset NAME --out DIR [--seed S] [--set key=value ...]
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "commands.h"
#include "core/thread_pool.h"
#include "model/make_model.h"

namespace moeserve::cli {

namespace {
std::string default_tokenizer_dir() {
  if (const char* env = std::getenv("MOESERVE_TOKENIZER_DIR")) return env;
  return std::string(MOESERVE_SOURCE_DIR) + "/assets/tokenizer/deepseek-v3";
}
}  // namespace

Subcommand add_make_model_command(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "make-model", "Write a random-weight checkpoint in the official DeepSeek FP8 format");
  auto opts = std::make_shared<MakeModelOptions>();
  auto out = std::make_shared<std::string>();
  auto threads = std::make_shared<int>(0);
  app->add_option("--preset", opts->preset,
                  "tiny | bench | v2-lite-tiny | v32-tiny | v4-tiny | v4-flash-bench")
      ->capture_default_str();
  app->add_option("--out", *out, "Output directory")->required();
  app->add_option("--seed", opts->seed, "Random seed")->capture_default_str();
  app->add_option("--set", opts->overrides, "Override a config.json field: key=value (JSON value)");
  app->add_option("--shards", opts->shards, "Number of shards (default: automatic, >= 2)");
  app->add_option("--threads", *threads, "Threads (default: all)");
  return {app, [opts, out, threads] {
            auto start = std::chrono::steady_clock::now();
            Result<ModelConfig> config = make_model_config(*opts);
            if (!config.ok()) {
              fmt::print(stderr, "make-model: {}\n", config.status().message());
              return 2;
            }
            // The tokenizer only fits checkpoints with its vocabulary size or more.
            std::string tok = default_tokenizer_dir();
            if (config->vocab_size >= 129280 &&
                std::filesystem::exists(std::filesystem::path(tok) / "tokenizer.json")) {
              opts->tokenizer_dir = tok;
            } else {
              fmt::print(
                  stderr, "make-model: not copying the DeepSeek-V3 tokenizer ({})\n",
                  config->vocab_size < 129280 ? "vocab_size < 129280" : "not found at " + tok);
            }
            ThreadPool pool(*threads);
            Result<uint64_t> bytes = make_model(*opts, *out, &pool);
            if (!bytes.ok()) {
              fmt::print(stderr, "make-model: {}\n", bytes.status().message());
              return 1;
            }
            double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            fmt::print(stderr, "make-model: wrote {} ({:.1f} MB of tensors) in {:.1f} s\n", *out,
                       double(*bytes) / 1e6, secs);
            return 0;
          }};
}

}  // namespace moeserve::cli
