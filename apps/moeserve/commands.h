// The `moeserve` subcommands. Each add_*_command registers its options on the parent app and
// returns the function that runs it (its exit code: 0 ok, 1 runtime error, 2 usage error).
// One file per subcommand: cmd_<name>.cpp.
#pragma once

#include <functional>
#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include "core/dtype.h"
#include "format_flags.h"
#include "model/deepseek.h"

namespace moeserve::cli {

// `--kv-cache-dtype bf16|fp8|f32` (the latent KV cache's format: kernels/kv_token.h), shared by
// `generate` and `serve`; sets kv_dtype, which must outlive the parse.
inline CLI::Option* add_kv_cache_dtype_option(CLI::App& app, DType& kv_dtype) {
  static const std::map<std::string, DType> kNames = {
      {"bf16", DType::kBF16}, {"fp8", DType::kF8E4M3}, {"f32", DType::kF32}};
  std::string current = "bf16";
  for (const auto& [name, dtype] : kNames) {
    if (dtype == kv_dtype) current = name;
  }
  return app
      .add_option_function<std::string>(
          "--kv-cache-dtype", [&kv_dtype](const std::string& name) { kv_dtype = kNames.at(name); },
          "bf16 | fp8 (FlashMLA's FP8 with scale: 656 bytes per token per layer for V3, against "
          "1,152; needs kv_lora_rank % 128 == 0) | f32")
      ->check(CLI::IsMember({"bf16", "fp8", "f32"}))
      ->default_str(current);
}

// `--weight-cache DIR` (model/weight_cache.h, docs/memory.md), shared by `generate`, `serve`
// and `perplexity`.
inline void add_weight_cache_flag(CLI::App& app, std::string& dir) {
  app.add_option("--weight-cache", dir,
                 "Directory for the prepared (repacked) weights: the first start writes them "
                 "there, later starts map them instead of converting the checkpoint (one file "
                 "per model and option set; see docs/memory.md)");
}

struct Subcommand {
  CLI::App* app;
  std::function<int()> run;
};

Subcommand add_make_model_command(CLI::App& parent);
Subcommand add_generate_command(CLI::App& parent);
Subcommand add_sim_command(CLI::App& parent);
Subcommand add_eplb_command(CLI::App& parent);
Subcommand add_serve_command(CLI::App& parent);
Subcommand add_router_command(CLI::App& parent);
Subcommand add_tokenize_command(CLI::App& parent);
Subcommand add_detokenize_command(CLI::App& parent);
Subcommand add_perplexity_command(CLI::App& parent);
Subcommand add_render_chat_command(CLI::App& parent);

}  // namespace moeserve::cli
