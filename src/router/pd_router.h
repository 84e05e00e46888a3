// PdRouter: the Engine behind `moeserve router` (docs/pd.md). The OpenAI front door (the same
// OpenAiService and HttpServer as `serve`) submits requests to it as to a local engine; it
// sends each to a prefill unit chosen by the prefill balancer (balancers.h), and when the
// prefill unit hands the request off, to a decode unit chosen by the decode balancer, which
// pulls the KV from the prefill unit and streams the tokens back through here.
//
// Units register, heartbeat and deregister on the routes of routes(); a unit silent for
// unit_timeout is taken out of the choice. A decode unit lost mid-stream (its connection gone,
// or its heartbeats older than unit_timeout) does not end its requests: each is re-bound to
// another decode unit with the tokens the client already has, which pulls the KV again from the
// prefill unit (retained there until the router releases it at the request's end), or, when
// that KV is gone, after a new prefill (docs/fault-tolerance.md). GET /admin/units lists them; POST
// /admin/drain takes one out of service in an orderly way (docs/pd.md).
//
// Threading: the Engine methods from any thread; each request's flow runs on its own thread,
// which makes its callbacks (in order).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "engine/engine.h"
#include "router/balancers.h"
#include "router/pd_protocol.h"
#include "router/planner.h"
#include "server/http_server.h"
#include "transfer/ucx_stream.h"

namespace moeserve {

using Clock = std::chrono::steady_clock;

struct RouterOptions {
  int64_t vocab_size = 0;  // of the model the units serve
  int64_t max_context = 0;
  std::chrono::milliseconds unit_timeout{2500};  // no heartbeat for this long: out of the choice
  std::chrono::milliseconds prefill_timeout{std::chrono::minutes(10)};       // one prefill call
  std::chrono::milliseconds decode_idle_timeout{std::chrono::seconds(120)};  // between outputs
  double cache_slack = 0.25;  // choose_prefill's slack for cache awareness
  int prefill_attempts = 3;   // prefill units tried when one cannot be reached
  int decode_attempts = 4;    // decode units tried per request (re-binds + 1)
  // How long a re-bound request waits for another decode unit to be alive (one restarting).
  std::chrono::milliseconds rebind_wait{std::chrono::seconds(10)};
  // How long a new request waits for a unit of a role to be alive when none is (a fleet scaling
  // up from none, every unit's heartbeat late under load) before it fails with 503.
  std::chrono::milliseconds unit_wait{std::chrono::seconds(5)};
  int64_t prefix_blocks_per_unit = 1 << 16;  // block hashes remembered per prefill unit
  std::string api_key;  // sent to the units (one key for the deployment); empty: none
  // The planner (docs/planner.md): every `interval` it reads what the router measured, decides
  // the prefill and decode unit counts, logs why, shows them in /metrics and, when the target
  // changes or the units alive differ from it (one died, or has not registered yet), runs `hook`
  // with the two counts as arguments (an orchestrator's "set replicas": idempotent).
  struct Planning {
    std::chrono::milliseconds interval{0};  // 0: no planner
    PlannerOptions options;
    std::string forecaster = "seasonal-naive";  // or "holt-winters", "lstm"
    int64_t period = 0;                         // intervals in a season (a day); 0: a day's worth
    HoltWintersParams holt_winters;
    LstmSeries lstm;                    // forecaster "lstm": its weights (read_lstm_weights)
    std::string hook;                   // a shell command; empty: none
    std::vector<IntervalLoad> history;  // past intervals, oldest first (read_interval_history)
  } planning;
};

struct RouterStats {
  int64_t requests = 0;
  int64_t handed_off = 0;
  int64_t prefill_retries = 0;  // prefill units that could not be reached, tried elsewhere
  int64_t rebinds = 0;          // requests moved to another decode unit mid-stream
  int64_t reprefills = 0;       // re-binds whose KV was gone: prefilled again first
  int64_t released = 0;         // hand-offs released at their prefill units
  int64_t failed = 0;
  int64_t by_cache = 0;  // prefill choices decided by the cached prefix
  int64_t attached = 0;  // keyed requests served from a decode unit's kept stream
};

class PdRouter final : public Engine {
 public:
  explicit PdRouter(RouterOptions options);
  ~PdRouter() override;  // cancels the flows in flight and waits for them

  Status submit(EngineRequest request, OutputCallback callback) override;
  void cancel(const std::string& id) override;
  EngineStats stats() const override;
  bool healthy() const override { return true; }
  int64_t vocab_size() const override { return options_.vocab_size; }
  int64_t max_context() const override { return options_.max_context; }

  std::vector<HttpRoute> routes();
  std::string metrics_text() const;
  std::string units_json() const;
  RouterStats router_stats() const;

  Reply register_unit(std::string_view body);
  Reply heartbeat(std::string_view body);
  Reply deregister(std::string_view body);
  // POST /admin/drain {"unit": NAME}: the unit gets no new work from here on and is told to
  // drain (POST /pd/v1/drain on it): it finishes what it runs, deregisters and exits 0.
  Reply drain_unit(std::string_view body);

 private:
  struct Unit {
    UnitInfo info;
    UnitLoad load;
    Clock::time_point last_seen;
    bool draining = false;
    int64_t epoch = 0;  // which registration: a unit that restarts under its name is new
    // The router's own view, exact and immediate (heartbeats lag behind).
    int64_t input_tokens = 0;  // prompt tokens sent to prefill, not answered yet
    double attention = 0;
    int64_t assigned_total = 0;  // prompt tokens ever sent to it
    int64_t decodes = 0;         // decode streams open
    int64_t prefills_total = 0, decodes_total = 0, failures = 0;
    std::unordered_set<uint64_t> prefix;  // block chain hashes of prompts it prefilled
    std::deque<uint64_t> prefix_order;    // oldest first (to bound prefix)
  };
  struct Flow {
    EngineRequest request;
    OutputCallback callback;
    std::atomic<bool> cancelled{false};
    std::atomic<bool> done{false};
    std::thread thread;
    // A keyed request (docs/fault-tolerance.md): the tokens the client has, for the decode unit
    // that keeps them for a router that attaches.
    std::vector<GeneratedToken> delivered_tokens;
  };

  // How one decode attempt ended.
  enum class DecodeEnd {
    kDone,     // finished (or the client went away)
    kLost,     // the unit went away or fell silent mid-stream: re-bind, same KV
    kNoKv,     // the unit could not get the KV (gone from the prefill unit): prefill again
    kRefused,  // the unit would not take it (draining, full): another unit, same KV
    kFailed,   // an error re-binding would not cure
  };
  void run(Flow& f);
  // A keyed request that a decode unit still has (its first router died): its outputs from
  // there. False when no decode unit has it, or the unit went away before its end (`had`: the
  // tokens delivered until then).
  bool attach(Flow& f, int64_t* had);
  Status run_prefill(Flow& f, PrefillReply* reply, std::string* unit);
  // delivered: the tokens the client has (in), with those this attempt forwarded (out);
  // avoid: units not to choose (the lost ones), this attempt's unit appended.
  DecodeEnd run_decode(Flow& f, const PrefillReply& reply, std::vector<int32_t>* delivered,
                       std::vector<std::string>* avoid, Status* error);
  void release(const PrefillReply& reply);
  bool alive(const Unit& u, Clock::time_point now) const;
  void planner_loop();
  IntervalLoad take_interval();  // what was measured since the last call
  std::vector<uint64_t> block_hashes(const std::vector<int32_t>& prompt) const;
  void reap_locked();

  RouterOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, Unit> units_;  // by name
  std::list<Flow> flows_;
  RouterStats stats_;
  std::shared_ptr<UcxContext> ucx_;  // for releases (made at the first)
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0, cached_tokens_ = 0;
  int64_t registrations_ = 0;
  bool stopping_ = false;
  // The planner's measurements and state (guarded by mu_ unless said otherwise).
  std::vector<double> ttft_s_, tpot_s_;  // this interval's requests
  Clock::time_point interval_start_ = Clock::now();
  int64_t interval_requests_ = 0, interval_prompt_ = 0, interval_cached_ = 0,
          interval_generated_ = 0;    // the counters at the interval's start
  std::unique_ptr<Planner> planner_;  // used by planner_thread_ only, but metrics: guarded by mu_
  std::string planner_metrics_;
  std::thread planner_thread_;
  std::condition_variable planner_cv_;
};

}  // namespace moeserve
