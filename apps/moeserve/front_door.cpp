#include "front_door.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "grammar/xgrammar_backend.h"
#include "model/config.h"

namespace moeserve::cli {

Result<ChatTemplate> chat_template_for(const Tokenizer& tok, const std::string& model_dir) {
  Result<ModelConfig> config = load_model_config(model_dir + "/config.json");
  return ChatTemplate::for_model(tok, config.ok() ? config->model_type : "");
}

void add_front_door_flags(CLI::App& app, FrontDoorFlags& f) {
  HttpServerOptions& h = f.http;
  app.add_option("--tokenizer", f.tokenizer_dir, "Tokenizer directory (default: --model)");
  app.add_option("--served-model-name", f.served_model_name,
                 "Model name in the API (default: the model directory's name)");
  app.add_option("--host", h.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", h.port, "Port to listen on (1-65535)")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  app.add_option("--api-key", f.api_key,
                 "Require 'Authorization: Bearer KEY' on /v1 routes and the routes between a "
                 "router and its units (default: $MOESERVE_API_KEY)")
      ->envname("MOESERVE_API_KEY");
  app.add_option("--http-threads", h.http_threads, "Connections served at once")
      ->capture_default_str()
      ->check(CLI::Range(2, 4096));
  app.add_option("--shutdown-timeout", h.shutdown_timeout_s,
                 "Seconds in-flight requests may run after SIGTERM before they are cancelled")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-n", f.max_n, "Largest 'n' a request may ask for")
      ->capture_default_str()
      ->check(CLI::Range(1, 128));
  app.add_option("--max-logprobs", f.max_top_logprobs, "Largest 'top_logprobs'")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  app.add_option("--max-body-mb", f.max_body_mb, "Largest request body (MiB)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1024.0));
  app.add_flag("--reasoning-only", f.reasoning_only,
               "Every chat request thinks and none may call tools (DeepSeek-V3.2-Speciale; on "
               "by default when the model directory's name holds 'Speciale')");
}

std::optional<FrontDoor> open_front_door(FrontDoorFlags& f, const std::string& model_dir,
                                         const char* command) {
  const std::string dir = f.tokenizer_dir.empty() ? model_dir : f.tokenizer_dir;
  Result<Tokenizer> tok = Tokenizer::load(dir);
  if (!tok.ok()) {
    fmt::print(stderr, "{}: tokenizer: {} (give --tokenizer DIR)\n", command,
               tok.status().message());
    return std::nullopt;
  }
  Result<ChatTemplate> tmpl = chat_template_for(*tok, model_dir);
  if (!tmpl.ok()) {
    fmt::print(stderr, "{}: {}; using the DeepSeek-V3 chat format\n", command,
               tmpl.status().message());
    tmpl = ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekV3, tok->bos_token());
  }
  ServiceOptions so;
  so.served_model_name = f.served_model_name.empty()
                             ? std::filesystem::path(model_dir).filename().string()
                             : f.served_model_name;
  if (so.served_model_name.empty()) so.served_model_name = "moeserve";
  so.reasoning_only = f.reasoning_only || std::filesystem::path(model_dir).filename().string().find(
                                              "Speciale") != std::string::npos;
  if (so.reasoning_only && !f.reasoning_only) {
    fmt::print(stderr,
               "{}: '{}' is a reasoning-only model: every request thinks, none calls "
               "tools\n",
               command, model_dir);
  }
  so.limits.max_n = f.max_n;
  so.limits.max_top_logprobs = f.max_top_logprobs;
  if (!f.api_key.empty()) f.http.api_key = f.api_key;
  f.http.max_body_bytes = size_t(f.max_body_mb * 1024 * 1024);
  // response_format's grammars (docs/structured-outputs.md), over the model's vocabulary (its
  // lm_head may have rows past the tokenizer's ids).
  int64_t vocab = tok->vocab_size();
  if (auto config = load_model_config(model_dir + "/config.json"); config.ok()) {
    vocab = std::max(vocab, config->vocab_size);
  }
  auto grammar = XGrammarBackend::create(*tok, vocab);
  if (grammar.ok()) {
    so.grammar = std::move(*grammar);
  } else {
    fmt::print(stderr, "{}: JSON response formats are off: {}\n", command,
               grammar.status().message());
  }
  return FrontDoor{std::move(*tok), std::move(*tmpl), std::move(so)};
}

}  // namespace moeserve::cli
