// moeserve serve --model DIR [--host H --port P --api-key KEY --kv-cache-gb G ...]
// The OpenAI-compatible HTTP server over the continuous-batching engine (docs/server.md).
// Under `mpirun -np R` (or with --ep) every rank runs an engine over its own requests and KV
// cache with 1/R of the routed experts (docs/ep-serving.md); rank 0 also serves HTTP.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "core/trace.h"
#include "engine/llm_engine.h"
#include "ep/ep_group.h"
#include "ep_flags.h"
#include "eplb/expert_loads.h"
#include "front_door.h"
#include "model/config.h"
#include "router/pd_unit.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"
#include "spec_flags.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {

namespace {

constexpr int kDeadEngineGraceS = 3;

struct ServeOptions {
  EngineOptions engine;
  FrontDoorFlags front;  // the API's flags (front_door.h)
  std::string trace;     // Chrome trace JSON, written at exit (FILE.rank<r>.json under EP)
  EpFlags ep;            // expert parallelism (under mpirun or with --ep) and EPLB
  SpecFlags spec;        // MTP speculative decoding
  // Prefill/decode disaggregation (docs/pd.md): this process as a unit behind `moeserve router`.
  std::string role;                      // prefill, decode, both; empty: a server of its own
  std::vector<std::string> router_urls;  // http://host:port of each router to register with
  std::string advertise_host;            // how the router reaches this unit (default: --host)
  std::string transfer_host;       // where the KV transfer server listens (default: advertise)
  int transfer_port = 0;           // 0: any free port
  double kv_lease_s = 30;          // a hand-off nobody pulls is dropped after this
  double kv_retain_s = 600;        // a pulled one is kept this long for failover (unless released)
  double resume_grace_s = 30;      // a keyed decode request whose router died goes on this long
  double resume_retention_s = 60;  // a keyed decode request's outputs are kept after it ends
};

// Ranks other than 0 serve the requests rank 0 hands them until rank 0 stops the group, the
// group breaks, or (after SIGTERM) rank 0 has had its shutdown time and then some.
int run_worker_rank(Engine& engine, int rank, const sigset_t& stop_signals,
                    double shutdown_timeout_s) {
  std::optional<std::chrono::steady_clock::time_point> deadline;
  while (engine.healthy()) {
    timespec tick{0, 100 * 1000 * 1000};
    int sig = sigtimedwait(&stop_signals, nullptr, &tick);
    if (sig > 0 && !deadline) {
      // mpirun passes SIGTERM to every rank: rank 0 drains and then stops the group.
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(int64_t((shutdown_timeout_s + 10) * 1000));
    }
    if (deadline && std::chrono::steady_clock::now() > *deadline) break;
  }
  Status f = engine.failure();
  if (!f.ok()) {
    fmt::print(stderr, "serve (rank {}): {}\n", rank, f.message());
    return 1;
  }
  fmt::print(stderr, "serve (rank {}): stopped\n", rank);
  return 0;
}

int run_serve(ServeOptions o) {
  // SIGTERM/SIGINT are taken synchronously by this thread (sigwait); every thread started
  // from here on inherits the blocked mask. A closed client socket must not kill the server.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::optional<UnitRole> role;
  if (!o.role.empty() || !o.router_urls.empty()) {
    auto r = parse_unit_role(o.role.empty() ? "both" : o.role);
    if (!r.ok()) {
      fmt::print(stderr, "serve: --role: {}\n", r.status().message());
      return 2;
    }
    role = *r;
  }
  std::optional<FrontDoor> front = open_front_door(o.front, o.engine.model_dir, "serve");
  if (!front) return 1;
  o.engine.overlap = !o.ep.no_overlap;
  o.engine.overlap_min_tokens = o.ep.overlap_min_tokens;
  o.engine.progress = true;
  o.engine.speculative = o.spec.config();
  o.engine.grammar = front->service.grammar;  // (the front door checks specs with it too)

  if (std::string usage = check_ep_flags(o.ep); !usage.empty()) {
    fmt::print(stderr, "serve: {}\n", usage);
    return 2;
  }
  std::optional<EpGroup> ep;
  EngineParallel parallel;
  if (o.ep.enabled()) {
    auto config = load_model_config(o.engine.model_dir + "/config.json");
    if (!config.ok()) {
      fmt::print(stderr, "serve: {}\n", config.status().message());
      return 1;
    }
    auto group = join_ep_group(o.ep, *config, o.engine.max_batch_tokens,
                               /*bf16_rows=*/o.engine.compute == ComputePath::kFast,
                               /*mtp=*/o.spec.enabled());
    if (!group.ok()) {
      fmt::print(stderr, "serve: {}\n", group.status().message());
      return 1;
    }
    ep = std::move(*group);
    parallel.comm = ep->comm.get();
    parallel.dispatcher = ep->dispatcher.get();
    parallel.balancer = o.ep.eplb_interval > 0 ? ep->balancer.get() : nullptr;
    if (!o.ep.expert_stats_out.empty()) {
      parallel.on_clean_stop = [&ep, path = o.ep.expert_stats_out] {
        return report_expert_loads(*ep, path);
      };
    }
    // Heartbeats while idle: a few per timeout, so a quiet group is never taken for a dead one.
    parallel.idle_heartbeat = std::min(std::chrono::milliseconds(200),
                                       std::chrono::milliseconds(int64_t(o.ep.ep_timeout_s * 250)));
    o.engine.progress = ep->comm->rank() == 0;
  }
  const int rank = ep ? ep->comm->rank() : 0;
  std::optional<Tracer> tracer;
  if (!o.trace.empty()) {
    tracer.emplace(rank);
    o.engine.tracer = &*tracer;
  }
  auto write_trace = [&]() -> int {
    if (!tracer) return 0;
    std::string path =
        ep && ep->comm->size() > 1 ? fmt::format("{}.rank{}.json", o.trace, rank) : o.trace;
    if (Status st = tracer->write(path); !st.ok()) {
      fmt::print(stderr, "serve: {}\n", st.message());
      return 1;
    }
    return 0;
  };
  // A unit's KV transfer (docs/pd.md): every rank has its own, for the requests it runs.
  std::unique_ptr<PdTransport> transport;
  if (role) {
    if (o.advertise_host.empty()) o.advertise_host = o.front.http.host;
    KvTransferOptions to;
    to.host = o.transfer_host.empty() ? o.advertise_host : o.transfer_host;
    to.port = rank == 0 ? uint16_t(o.transfer_port) : 0;  // (ranks > 0: any free port)
    to.lease = std::chrono::milliseconds(int64_t(o.kv_lease_s * 1000));
    to.retain = std::chrono::milliseconds(int64_t(o.kv_retain_s * 1000));
    auto t = PdTransport::start(*role, to, PullOptions{});
    if (!t.ok()) {
      fmt::print(stderr, "serve{}: {}\n", ep ? fmt::format(" (rank {})", rank) : "",
                 t.status().message());
      return 1;
    }
    transport = std::move(*t);
    o.engine.pd = transport->hooks();
  }
  Result<std::unique_ptr<Engine>> engine = make_engine(o.engine, ep ? &parallel : nullptr);
  if (!engine.ok()) {
    fmt::print(stderr, "serve{}: {}\n", ep ? fmt::format(" (rank {})", rank) : "",
               engine.status().message());
    return 1;
  }
  if (transport) transport->set_fingerprint((*engine)->kv_fingerprint());
  if (rank != 0) {
    fmt::print(stderr,
               "serve (rank {} of {}): {} of {} routed experts here; serving rank 0's requests\n",
               rank, ep->comm->size(), ep->dispatcher->placement().experts_on(0, rank).size(),
               ep->dispatcher->placement().n_experts());
    int rc = run_worker_rank(**engine, rank, stop_signals, o.front.http.shutdown_timeout_s);
    engine->reset();  // joins the step thread before the trace is read
    return std::max(rc, write_trace());
  }
  if (int64_t(front->tokenizer.vocab_size()) > (*engine)->vocab_size()) {
    fmt::print(stderr, "serve: warning: the tokenizer has {} ids, the model {}\n",
               front->tokenizer.vocab_size(), (*engine)->vocab_size());
  }

  ServiceOptions& so = front->service;
  so.speculative = o.spec.enabled();

  {
    std::unique_ptr<PdUnit> unit;
    if (role) {
      PdUnitOptions uo;
      uo.role = *role;
      uo.router_urls = o.router_urls;
      uo.detached_grace = std::chrono::milliseconds(int64_t(o.resume_grace_s * 1000));
      uo.kept_retention = std::chrono::milliseconds(int64_t(o.resume_retention_s * 1000));
      uo.api_key = o.front.api_key;
      auto u = PdUnit::start(**engine, *transport, uo);
      if (!u.ok()) {
        fmt::print(stderr, "serve: {}\n", u.status().message());
        return 1;
      }
      unit = std::move(*u);
      for (HttpRoute& r : unit->routes()) o.front.http.routes.push_back(std::move(r));
      o.front.http.extra_metrics = [u = unit.get()] { return u->metrics_text(); };
    }
    ServerMetrics metrics;
    OpenAiService service(**engine, std::move(front->tokenizer), std::move(front->chat_template),
                          so, metrics);
    HttpServer http(service, **engine, metrics, o.front.http);
    if (Status s = http.start(); !s.ok()) {
      fmt::print(stderr, "serve: {}\n", s.message());
      return 1;
    }
    fmt::print(stderr, "serve: '{}' on http://{}:{} (context {} tokens{}{})\n",
               so.served_model_name, o.front.http.host, http.port(), (*engine)->max_context(),
               o.front.http.api_key ? ", API key required" : "",
               ep && ep->comm->size() > 1
                   ? fmt::format(", {} ranks: attention data-parallel, experts {}-way parallel",
                                 ep->comm->size(), ep->comm->size())
                   : "");
    if (unit) {
      unit->join(fmt::format("http://{}:{}", o.advertise_host, http.port()));
      fmt::print(stderr, "serve: {} unit{}{}\n", to_string(*role),
                 unit->info().transfer.empty() ? "" : ", KV transfer on " + unit->info().transfer,
                 o.router_urls.empty()
                     ? ""
                     : fmt::format(", router{} {}", o.router_urls.size() > 1 ? "s" : "",
                                   fmt::join(o.router_urls, ", ")));
    }

    // Until a signal, or until the engine dies (e.g. an EP peer went silent): then the API
    // answers 503 for a few seconds (clients see why) and the process exits non-zero so a
    // supervisor restarts it.
    int sig = 0;
    while (sig <= 0) {
      timespec tick{0, 100 * 1000 * 1000};
      sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig > 0) break;
      if (unit && unit->drain_requested()) break;  // the router's POST /admin/drain
      if (Status f = (*engine)->failure(); !f.ok()) {
        fmt::print(stderr, "serve: {}; answering 503 for {} s, then exiting\n", f.message(),
                   kDeadEngineGraceS);
        if (unit) unit->drain();
        std::this_thread::sleep_for(std::chrono::seconds(kDeadEngineGraceS));
        http.shutdown();
        return 1;
      }
    }
    fmt::print(stderr, "serve: {}; finishing requests in flight (up to {} s)\n",
               sig == SIGTERM  ? "SIGTERM received"
               : sig == SIGINT ? "SIGINT received"
                               : "the router asked this unit to drain",
               o.front.http.shutdown_timeout_s);
    if (unit) unit->drain();  // the router sends nothing new; what runs here finishes
    http.shutdown();
    if (unit) {
      // The hand-offs made before the drain stay until their decode units have pulled them.
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(int64_t(o.kv_lease_s * 1000));
      if (const int64_t left = unit->wait_handoffs(until); left > 0) {
        fmt::print(stderr, "serve: {} hand-off(s) not pulled within the lease; leaving them\n",
                   left);
      }
    }
  }                 // the HTTP side is gone before the engine
  engine->reset();  // under EP this also stops the other ranks
  fmt::print(stderr, "serve: stopped\n");
  return write_trace();
}

}  // namespace

Subcommand add_serve_command(CLI::App& parent) {
  auto* app =
      parent.add_subcommand("serve", "Serve a checkpoint over an OpenAI-compatible HTTP API");
  auto o = std::make_shared<ServeOptions>();
  EngineOptions& e = o->engine;
  app->add_option("--model", e.model_dir, "Checkpoint directory (HF layout)")->required();
  add_front_door_flags(*app, o->front);
  app->add_option("--kv-cache-gb", e.kv_cache_gb, "Memory for the latent KV cache")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--kv-window-blocks", e.kv_window_blocks,
                  "Pages of the sliding-window pool (V4: the window entries of the blocks that "
                  "running sequences read, and cached ones for prefix reuse; default: twice what "
                  "--max-num-seqs and --max-batch-tokens need, within half of --kv-cache-gb)")
      ->check(CLI::PositiveNumber);
  app->add_option("--kv-disk", e.kv_disk_dir,
                  "Directory of the KV cache's disk tier (shared by every process using it; "
                  "survives restarts)");
  app->add_option("--kv-disk-gb", e.kv_disk_gb, "Size bound of --kv-disk (0: none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  add_kv_cache_dtype_option(*app, e.kv_dtype);
  add_format_flags(*app, e.formats);
  add_weight_cache_flag(*app, e.weight_cache_dir);
  app->add_option_function<std::string>(
         "--attention",
         [&e](const std::string& v) {
           e.attention = v == "mha-prefill" ? AttentionMode::kMhaPrefill : AttentionMode::kAbsorbed;
         },
         "absorbed | mha-prefill (absorbed, and a sequence's prefill chunks long enough to gain by "
         "it in MHA form, DeepSeek's prefill form: at V3's widths whole prompts of ~390+ tokens, "
         "256-token chunks past ~540 tokens of context; a prompt's result then depends on its "
         "chunking by rounding: docs/kernels-mla.md)")
      ->check(CLI::IsMember({"absorbed", "mha-prefill"}))
      ->default_str("absorbed");
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
  app->add_option(
         "--compute", e.compute,
         "fast (BF16 activations, SIMD kernels) | reference (FP32, scalar: the path held to "
         "the Hugging Face fixtures)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, ComputePath>{
          {"fast", ComputePath::kFast}, {"reference", ComputePath::kReference}}))
      ->default_str("fast");
  app->add_option(
      "--trace", o->trace,
      "Write a Chrome trace (Perfetto, chrome://tracing) of every step's stages at exit "
      "(FILE.rank<r>.json per rank under EP)");
  app->add_option("--role", o->role,
                  "Run as a unit of a disaggregated deployment: prefill, decode or both "
                  "(docs/pd.md; default with --router: both)")
      ->check(CLI::IsMember({"prefill", "decode", "both"}));
  app->add_option("--router", o->router_urls,
                  "Register with the router at this URL (http://host:port) and heartbeat to it; "
                  "repeat it for several routers in front of the same units");
  app->add_option("--advertise-host", o->advertise_host,
                  "The address the router and other units reach this unit at (default: --host)");
  app->add_option("--kv-transfer-host", o->transfer_host,
                  "Where the KV transfer server of a prefill unit listens (default: "
                  "--advertise-host)");
  app->add_option("--kv-transfer-port", o->transfer_port, "Its port (0: any free one)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app->add_option("--kv-lease", o->kv_lease_s,
                  "Seconds a prefill unit keeps a hand-off's KV for the decode unit to pull")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--resume-grace", o->resume_grace_s,
                  "Seconds a decode unit goes on with a request sent with an Idempotency-Key after "
                  "its router's stream dropped, for another router to attach to; then it is "
                  "cancelled (docs/fault-tolerance.md)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--resume-retention", o->resume_retention_s,
                  "Seconds a decode unit keeps such a request's outputs after it ended (a retried "
                  "call is answered from them)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--kv-retain", o->kv_retain_s,
                  "Seconds a prefill unit keeps a pulled hand-off for a second pull when its "
                  "decode unit is lost, unless the router releases it first (its request ended; "
                  "docs/fault-tolerance.md); 0: dropped once pulled")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  add_ep_flags(*app, o->ep);
  add_spec_flags(*app, o->spec);
  return {app, [o] { return run_serve(*o); }};
}

}  // namespace moeserve::cli
