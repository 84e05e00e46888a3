// moeserve router --model DIR [--host H --port P --api-key KEY ...]
// The OpenAI-compatible front door of a disaggregated deployment (docs/pd.md): the same API,
// validation, streaming, auth and metrics as `serve`, over prefill and decode units that
// register with it (`moeserve serve --role prefill|decode --router URL`). The model directory
// gives the tokenizer, the chat template and the context length; no weights are loaded.
#include <pthread.h>
#include <signal.h>

#include <filesystem>

#include <fmt/format.h>

#include "commands.h"
#include "model/config.h"
#include "router/pd_router.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {

namespace {

struct RouterCmdOptions {
  std::string model_dir;
  std::string tokenizer_dir;
  std::string served_model_name;
  HttpServerOptions http;
  std::string api_key;
  RouterOptions router;
  int64_t unit_timeout_ms = 2500;
  int64_t max_n = 8;
  int64_t max_top_logprobs = 20;
  int64_t max_model_len = 0;
};

int run_router(RouterCmdOptions o) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto config = load_model_config(o.model_dir + "/config.json");
  if (!config.ok()) {
    fmt::print(stderr, "router: {}\n", config.status().message());
    return 1;
  }
  if (o.tokenizer_dir.empty()) o.tokenizer_dir = o.model_dir;
  Result<Tokenizer> tok = Tokenizer::load(o.tokenizer_dir);
  if (!tok.ok()) {
    fmt::print(stderr, "router: tokenizer: {} (give --tokenizer DIR)\n", tok.status().message());
    return 1;
  }
  Result<ChatTemplate> tmpl = ChatTemplate::for_tokenizer(*tok);
  if (!tmpl.ok()) {
    fmt::print(stderr, "router: {}; using the DeepSeek-V3 chat format\n", tmpl.status().message());
    tmpl = ChatTemplate::of_variant(ChatTemplate::Variant::kDeepSeekV3, tok->bos_token());
  }
  o.router.vocab_size = config->vocab_size;
  o.router.max_context = o.max_model_len > 0
                             ? std::min(o.max_model_len, config->max_position_embeddings)
                             : config->max_position_embeddings;
  o.router.unit_timeout = std::chrono::milliseconds(o.unit_timeout_ms);

  ServiceOptions so;
  so.served_model_name = o.served_model_name.empty()
                             ? std::filesystem::path(o.model_dir).filename().string()
                             : o.served_model_name;
  if (so.served_model_name.empty()) so.served_model_name = "moeserve";
  so.limits.max_n = o.max_n;
  so.limits.max_top_logprobs = o.max_top_logprobs;
  if (!o.api_key.empty()) o.http.api_key = o.api_key;
  o.router.api_key = o.api_key;

  PdRouter router(o.router);
  o.http.routes = router.routes();
  o.http.extra_metrics = [&router] { return router.metrics_text(); };
  {
    ServerMetrics metrics;
    OpenAiService service(router, std::move(*tok), std::move(*tmpl), so, metrics);
    HttpServer http(service, router, metrics, o.http);
    if (Status s = http.start(); !s.ok()) {
      fmt::print(stderr, "router: {}\n", s.message());
      return 1;
    }
    fmt::print(stderr,
               "router: '{}' on http://{}:{} (context {} tokens); units register at "
               "/pd/v1/register\n",
               so.served_model_name, o.http.host, http.port(), o.router.max_context);
    int sig = 0;
    while (sig <= 0) sig = sigwaitinfo(&stop_signals, nullptr);
    fmt::print(stderr, "router: {} received; finishing requests in flight (up to {} s)\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", o.http.shutdown_timeout_s);
    http.shutdown();
  }
  fmt::print(stderr, "router: stopped\n");
  return 0;
}

}  // namespace

Subcommand add_router_command(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "router", "Serve the OpenAI API over prefill and decode units (disaggregation)");
  auto o = std::make_shared<RouterCmdOptions>();
  HttpServerOptions& h = o->http;
  app->add_option("--model", o->model_dir,
                  "Checkpoint directory the units serve (its config and tokenizer are read)")
      ->required();
  app->add_option("--tokenizer", o->tokenizer_dir, "Tokenizer directory (default: --model)");
  app->add_option("--served-model-name", o->served_model_name,
                  "Model name in the API (default: the model directory's name)");
  app->add_option("--host", h.host, "Address to listen on")->capture_default_str();
  app->add_option("--port", h.port, "Port to listen on (1-65535)")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  app->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on /v1 and unit routes (default: "
                  "$MOESERVE_API_KEY)")
      ->envname("MOESERVE_API_KEY");
  app->add_option("--unit-timeout-ms", o->unit_timeout_ms,
                  "A unit without a heartbeat for this long gets no new work")
      ->capture_default_str()
      ->check(CLI::Range(100, 600000));
  app->add_option("--cache-slack", o->router.cache_slack,
                  "How much more loaded (fraction) the prefill unit with the longest cached "
                  "prefix may be and still be chosen")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  app->add_option("--max-model-len", o->max_model_len,
                  "Context length (default: the model's max_position_embeddings)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--http-threads", h.http_threads, "Connections served at once")
      ->capture_default_str()
      ->check(CLI::Range(2, 4096));
  app->add_option("--shutdown-timeout", h.shutdown_timeout_s,
                  "Seconds in-flight requests may run after SIGTERM")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--max-n", o->max_n, "Largest 'n' a request may ask for")
      ->capture_default_str()
      ->check(CLI::Range(1, 128));
  app->add_option("--max-logprobs", o->max_top_logprobs, "Largest 'top_logprobs'")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  return {app, [o] { return run_router(*o); }};
}

}  // namespace moeserve::cli
