// moeserve router --model DIR [--host H --port P --api-key KEY ...]
// The OpenAI-compatible front door of a disaggregated deployment (docs/pd.md): the same API,
// validation, streaming, auth and metrics as `serve`, over prefill and decode units that
// register with it (`moeserve serve --role prefill|decode --router URL`). The model directory
// gives the tokenizer, the chat template and the context length; no weights are loaded.
#include <pthread.h>
#include <signal.h>

#include <fmt/format.h>

#include "commands.h"
#include "front_door.h"
#include "model/config.h"
#include "router/pd_router.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"

namespace moeserve::cli {

namespace {

struct RouterCmdOptions {
  std::string model_dir;
  FrontDoorFlags front;  // the API's flags (front_door.h), as `serve` has them
  RouterOptions router;
  int64_t unit_timeout_ms = 2500;
  int64_t unit_wait_ms = 5000;
  int64_t max_model_len = 0;
  double planner_interval_s = 0;
  std::string planner_policy = "forecast";
  std::string planner_history;               // a CSV file of past intervals
  std::string planner_lstm;                  // the LSTM's weights (train_lstm.py --out)
  std::vector<double> planner_holt_winters;  // alpha, beta, gamma, phi
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
  std::optional<FrontDoor> front = open_front_door(o.front, o.model_dir, "router");
  if (!front) return 1;
  o.router.vocab_size = config->vocab_size;
  o.router.max_context = o.max_model_len > 0
                             ? std::min(o.max_model_len, config->max_position_embeddings)
                             : config->max_position_embeddings;
  o.router.unit_timeout = std::chrono::milliseconds(o.unit_timeout_ms);
  o.router.unit_wait = std::chrono::milliseconds(o.unit_wait_ms);
  o.router.planning.interval = std::chrono::milliseconds(int64_t(o.planner_interval_s * 1000.0));
  if (o.planner_interval_s > 0 && (o.router.planning.options.prefill_tokens_per_s <= 0 ||
                                   o.router.planning.options.decode_tokens_per_s <= 0)) {
    fmt::print(stderr,
               "router: --planner-interval needs --planner-prefill-capacity and "
               "--planner-decode-capacity (one unit's measured tokens per second)\n");
    return 2;
  }
  PlannerOptions& po = o.router.planning.options;
  po.policy = o.planner_policy == "reactive" ? PlannerOptions::Policy::kReactive
                                             : PlannerOptions::Policy::kForecast;
  if (!o.planner_history.empty()) {
    auto history = read_interval_history(o.planner_history);
    if (!history.ok()) {
      fmt::print(stderr, "router: {}\n", history.status().message());
      return 2;
    }
    o.router.planning.history = std::move(*history);
  }
  if (o.router.planning.forecaster == "lstm") {
    if (o.planner_lstm.empty()) {
      fmt::print(stderr, "router: --planner-forecaster lstm needs --planner-lstm WEIGHTS\n");
      return 2;
    }
    auto weights = read_lstm_weights(o.planner_lstm);
    if (!weights.ok()) {
      fmt::print(stderr, "router: {}\n", weights.status().message());
      return 2;
    }
    o.router.planning.lstm = std::move(*weights);
  }
  if (!o.planner_holt_winters.empty()) {
    const std::vector<double>& v = o.planner_holt_winters;
    o.router.planning.holt_winters = {v[0], v[1], v[2], v[3]};
  }

  const ServiceOptions& so = front->service;
  o.router.api_key = o.front.api_key;

  PdRouter router(o.router);
  o.front.http.routes = router.routes();
  o.front.http.extra_metrics = [&router] { return router.metrics_text(); };
  {
    ServerMetrics metrics;
    OpenAiService service(router, std::move(front->tokenizer), std::move(front->chat_template), so,
                          metrics);
    HttpServer http(service, router, metrics, o.front.http);
    if (Status s = http.start(); !s.ok()) {
      fmt::print(stderr, "router: {}\n", s.message());
      return 1;
    }
    fmt::print(stderr,
               "router: '{}' on http://{}:{} (context {} tokens); units register at "
               "/pd/v1/register\n",
               so.served_model_name, o.front.http.host, http.port(), o.router.max_context);
    int sig = 0;
    while (sig <= 0) sig = sigwaitinfo(&stop_signals, nullptr);
    fmt::print(stderr, "router: {} received; finishing requests in flight (up to {} s)\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", o.front.http.shutdown_timeout_s);
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
  app->add_option("--model", o->model_dir,
                  "Checkpoint directory the units serve (its config and tokenizer are read)")
      ->required();
  add_front_door_flags(*app, o->front);
  app->add_option("--unit-wait-ms", o->unit_wait_ms,
                  "A new request that finds no prefill or no decode unit alive waits this long "
                  "for one (a fleet scaling up from none) before it fails with 503")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(600000)));
  app->add_option("--unit-timeout-ms", o->unit_timeout_ms,
                  "A unit without a heartbeat for this long gets no new work")
      ->capture_default_str()
      ->check(CLI::Range(100, 600000));
  app->add_option("--cache-slack", o->router.cache_slack,
                  "How much more loaded (fraction) the prefill unit with the longest cached "
                  "prefix may be and still be chosen")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  // The planner (docs/planner.md).
  PlannerOptions& po = o->router.planning.options;
  app->add_option("--planner-interval", o->planner_interval_s,
                  "Seconds between the planner's decisions (0: no planner)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--planner-prefill-capacity", po.prefill_tokens_per_s,
                  "Uncached prompt tokens one prefill unit prefills per second within the TTFT "
                  "target (measured)");
  app->add_option("--planner-decode-capacity", po.decode_tokens_per_s,
                  "Output tokens one decode unit generates per second within the TPOT target "
                  "(measured)");
  app->add_option("--planner-headroom", po.headroom, "Capacity kept above the forecast")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 10.0));
  app->add_option("--planner-error-quantile", po.error_quantile,
                  "Keep at least this quantile of (what came / what was forecast) over the last "
                  "--planner-error-window intervals as headroom (0: --planner-headroom alone)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--planner-error-window", po.error_window,
                  "Intervals of forecast misses --planner-error-quantile reads")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(100000)));
  app->add_option("--planner-ttft-p99", po.ttft_p99_target_s, "TTFT p99 target (seconds)")
      ->capture_default_str();
  app->add_option("--planner-tpot-p99", po.tpot_p99_target_s, "TPOT p99 target (seconds)")
      ->capture_default_str();
  app->add_option("--planner-min-prefill", po.min_prefill)->capture_default_str();
  app->add_option("--planner-max-prefill", po.max_prefill)->capture_default_str();
  app->add_option("--planner-min-decode", po.min_decode)->capture_default_str();
  app->add_option("--planner-max-decode", po.max_decode)->capture_default_str();
  app->add_option("--planner-down-after", po.down_after,
                  "Intervals below the current count before one unit goes")
      ->capture_default_str();
  app->add_option("--planner-forecaster", o->router.planning.forecaster,
                  "seasonal-naive, holt-winters or lstm (chosen by measured accuracy: "
                  "bench/traces/README.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"seasonal-naive", "holt-winters", "lstm"}));
  app->add_option("--planner-lstm", o->planner_lstm,
                  "The LSTM forecaster's weights (tools/traces/train_lstm.py --out)")
      ->check(CLI::ExistingFile);
  app->add_option("--planner-policy", o->planner_policy,
                  "forecast (units for the forecast of the next interval) or reactive (a "
                  "threshold policy on the last interval's utilization, as a baseline)")
      ->capture_default_str()
      ->check(CLI::IsMember({"forecast", "reactive"}));
  app->add_option("--planner-up-utilization", po.up_utilization,
                  "reactive: scale up above this utilization of the running units")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--planner-down-utilization", po.down_utilization,
                  "reactive: one unit down below this utilization")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--planner-history", o->planner_history,
                  "CSV of past intervals to forecast from (header requests_per_s,"
                  "input_tokens_per_s,cached_tokens_per_s,output_tokens_per_s; oldest first)")
      ->check(CLI::ExistingFile);
  app->add_option("--planner-holt-winters", o->planner_holt_winters,
                  "Holt-Winters smoothing: alpha,beta,gamma,phi (fitted offline: "
                  "tools/traces/forecast.py --params)")
      ->delimiter(',')
      ->expected(4)
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--planner-period", o->router.planning.period,
                  "Intervals in a season (default: a day's worth)");
  app->add_option("--planner-hook", o->router.planning.hook,
                  "A command run with the prefill and decode unit targets as its last two "
                  "arguments when they change (an orchestrator's scale call)");
  app->add_option("--max-model-len", o->max_model_len,
                  "Context length (default: the model's max_position_embeddings)")
      ->check(CLI::NonNegativeNumber);
  return {app, [o] { return run_router(*o); }};
}

}  // namespace moeserve::cli
