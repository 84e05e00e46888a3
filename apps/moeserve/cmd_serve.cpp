// moeserve serve --model DIR [--host H --port P --api-key KEY --kv-cache-gb G ...]
// The OpenAI-compatible HTTP server over the continuous-batching engine (docs/server.md).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "commands.h"
#include "engine/llm_engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {

namespace {

struct ServeOptions {
  EngineOptions engine;
  std::string tokenizer_dir;  // default: the model directory
  std::string served_model_name;
  HttpServerOptions http;
  std::string api_key;
  std::string kv_dtype = "bf16";
  int64_t max_n = 8;
  int64_t max_top_logprobs = 20;
  double max_body_mb = 8;
};

int run_serve(ServeOptions o) {
  if (o.http.port < 1 || o.http.port > 65535) {
    fmt::print(stderr, "serve: --port {} is not a port (1-65535)\n", o.http.port);
    return 2;
  }
  // SIGTERM/SIGINT are taken synchronously by this thread (sigwait); every thread started
  // from here on inherits the blocked mask. A closed client socket must not kill the server.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (o.tokenizer_dir.empty()) o.tokenizer_dir = o.engine.model_dir;
  Result<Tokenizer> tok = Tokenizer::load(o.tokenizer_dir);
  if (!tok.ok()) {
    fmt::print(stderr, "serve: tokenizer: {} (give --tokenizer DIR)\n", tok.status().message());
    return 1;
  }
  Result<ChatTemplate> tmpl = ChatTemplate::for_tokenizer(*tok);
  if (!tmpl.ok()) {
    fmt::print(stderr, "serve: {}; using the DeepSeek-V3 chat format\n", tmpl.status().message());
    tmpl = ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekV3, tok->bos_token());
  }
  o.engine.kv_dtype = o.kv_dtype == "f32" ? DType::kF32 : DType::kBF16;
  o.engine.progress = true;
  Result<std::unique_ptr<Engine>> engine = make_engine(o.engine);
  if (!engine.ok()) {
    fmt::print(stderr, "serve: {}\n", engine.status().message());
    return 1;
  }
  if (int64_t(tok->vocab_size()) > (*engine)->vocab_size()) {
    fmt::print(stderr, "serve: warning: the tokenizer has {} ids, the model {}\n",
               tok->vocab_size(), (*engine)->vocab_size());
  }

  ServiceOptions so;
  so.served_model_name = o.served_model_name.empty()
                             ? std::filesystem::path(o.engine.model_dir).filename().string()
                             : o.served_model_name;
  if (so.served_model_name.empty()) so.served_model_name = "moeserve";
  so.limits.max_n = o.max_n;
  so.limits.max_top_logprobs = o.max_top_logprobs;
  if (!o.api_key.empty()) o.http.api_key = o.api_key;
  o.http.max_body_bytes = size_t(o.max_body_mb * 1024 * 1024);

  ServerMetrics metrics;
  OpenAiService service(**engine, std::move(*tok), std::move(*tmpl), so, metrics);
  HttpServer http(service, **engine, metrics, o.http);
  if (Status s = http.start(); !s.ok()) {
    fmt::print(stderr, "serve: {}\n", s.message());
    return 1;
  }
  fmt::print(stderr, "serve: '{}' on http://{}:{} (context {} tokens{})\n", so.served_model_name,
             o.http.host, http.port(), (*engine)->max_context(),
             o.http.api_key ? ", API key required" : "");

  int sig = 0;
  sigwait(&stop_signals, &sig);
  fmt::print(stderr, "serve: {} received; finishing requests in flight (up to {} s)\n",
             sig == SIGTERM ? "SIGTERM" : "SIGINT", o.http.shutdown_timeout_s);
  http.shutdown();
  fmt::print(stderr, "serve: stopped\n");
  return 0;
}

}  // namespace

Subcommand add_serve_command(CLI::App& parent) {
  auto* app =
      parent.add_subcommand("serve", "Serve a checkpoint over an OpenAI-compatible HTTP API");
  auto o = std::make_shared<ServeOptions>();
  EngineOptions& e = o->engine;
  HttpServerOptions& h = o->http;
  app->add_option("--model", e.model_dir, "Checkpoint directory (HF layout)")->required();
  app->add_option("--tokenizer", o->tokenizer_dir, "Tokenizer directory (default: --model)");
  app->add_option("--served-model-name", o->served_model_name,
                  "Model name in the API (default: the model directory's name)");
  app->add_option("--host", h.host, "Address to listen on")->capture_default_str();
  app->add_option("--port", h.port, "Port to listen on (1-65535)")->capture_default_str();
  app->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on /v1 routes (default: $MOESERVE_API_KEY)")
      ->envname("MOESERVE_API_KEY");
  app->add_option("--kv-cache-gb", e.kv_cache_gb, "Memory for the latent KV cache")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--kv-cache-dtype", o->kv_dtype, "bf16 | f32")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  app->add_option("--max-num-seqs", e.max_num_seqs, "Sequences running at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--max-batch-tokens", e.max_batch_tokens, "Tokens per engine step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--max-waiting", e.max_waiting, "Queued requests beyond which new ones get 429")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--max-model-len", e.max_model_len,
                  "Context length (default: the model's max_position_embeddings)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--threads", e.threads, "Compute threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--http-threads", h.http_threads, "Connections served at once")
      ->capture_default_str()
      ->check(CLI::Range(2, 4096));
  app->add_option("--shutdown-timeout", h.shutdown_timeout_s,
                  "Seconds in-flight requests may run after SIGTERM before they are cancelled")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--max-n", o->max_n, "Largest 'n' a request may ask for")
      ->capture_default_str()
      ->check(CLI::Range(1, 128));
  app->add_option("--max-logprobs", o->max_top_logprobs, "Largest 'top_logprobs'")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  app->add_option("--max-body-mb", o->max_body_mb, "Largest request body (MiB)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1024.0));
  return {app, [o] { return run_serve(*o); }};
}

}  // namespace moeserve::cli
