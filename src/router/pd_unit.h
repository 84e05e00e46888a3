// PdUnit: what makes a `serve` process (rank 0 of a unit) a unit of a disaggregated deployment
// (docs/pd.md): the internal routes the router calls, and the registration with the router and
// its heartbeats. The KV itself moves through the engine's PdHooks (pd_transport.h), on the
// rank that runs each request.
//
//   prefill: POST /pd/v1/prefill runs the request with hand_off; the serving rank offers the
//            hand-off under a lease; the reply is the first token and where the KV is.
//   decode:  POST /pd/v1/decode submits the request to resume from there (the serving rank
//            pulls the KV) and streams its outputs (NDJSON, one RequestOutput per line).
//   both:    either.
//   attach:  POST /pd/v1/attach {"key"}: the outputs of the decode request sent with that
//            Idempotency-Key, from its start, then as they come (a router whose predecessor died
//            resumes a client's stream: docs/fault-tolerance.md). A keyed request goes on when its
//            router's stream drops, for `detached_grace`; its outputs are kept until
//            `kept_retention` after it ends. POST /pd/v1/cancel {"key"}: the router cancelled it
//            (its client went away): it ends now.
//   POST /pd/v1/drain: the router asks the unit to leave (drain_requested()).
//
// Registration runs on a thread of its own: with every router given (several routers front one
// fleet: docs/fault-tolerance.md), register, then a heartbeat every interval with the engine's
// load, so that each router's balancers see the load the others' requests make; a router that
// does not know the unit (it restarted) gets a registration again, so units rejoin a restarted
// router by themselves. The destructor deregisters.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "router/pd_protocol.h"
#include "router/pd_transport.h"
#include "server/http_server.h"
#include "server/reply.h"

namespace moeserve {

struct PdUnitOptions {
  UnitRole role = UnitRole::kBoth;
  std::vector<std::string> router_urls;  // http://host:port each; none: no registration
  std::string api_key;  // sent to the router (one key for the deployment); empty: none
  std::chrono::milliseconds heartbeat{500};
  // How long POST /pd/v1/prefill waits for the engine (queue and prefill) before it cancels.
  std::chrono::milliseconds prefill_timeout{std::chrono::minutes(10)};
  // A keyed decode request nobody reads (its router died) goes on this long, then is cancelled;
  // a finished one's outputs are kept this long for a router that attaches (a retried call).
  std::chrono::milliseconds detached_grace{std::chrono::seconds(30)};
  std::chrono::milliseconds kept_retention{std::chrono::seconds(60)};
};

struct KeptStream;

class PdUnit {
 public:
  // transport: rank 0's (its address is what the unit registers; borrowed, outlives the unit).
  // Nothing is registered yet.
  static Result<std::unique_ptr<PdUnit>> start(Engine& engine, PdTransport& transport,
                                               const PdUnitOptions& options);
  ~PdUnit();
  // The unit's HTTP side listens at `url` (http://host:port as the router reaches it): starts
  // registering and heartbeating (when there is a router).
  void join(const std::string& url);

  // The unit's routes, for HttpServerOptions::routes.
  std::vector<HttpRoute> routes();
  Reply prefill(std::string_view body);
  Reply decode(std::string_view body);
  Reply attach(std::string_view body);
  Reply cancel_kept(std::string_view body);  // POST /pd/v1/cancel {"key"}: the router cancelled
  // The kept stream a {"key"} body names (null: none here), taken out of kept_ when `remove`.
  Result<std::shared_ptr<KeptStream>> find_kept(std::string_view body, const char* what,
                                                bool remove);
  // Stops taking work (heartbeats say draining) and deregisters; idempotent.
  void drain();
  // POST /pd/v1/drain (the router's /admin/drain) was received: the process should leave as on
  // SIGTERM (drain, finish what runs, wait_handoffs, exit 0).
  bool drain_requested() const { return drain_requested_.load(); }
  // Until every hand-off this rank offered has been pulled (or withdrawn, or its lease ran
  // out), or `deadline`: a prefill unit that leaves must not take KV a decode unit still needs.
  // Returns the hand-offs still held.
  int64_t wait_handoffs(Clock::time_point deadline);
  // Prometheus lines of the transfer (appended to /metrics).
  std::string metrics_text();
  const UnitInfo& info() const { return info_; }

 private:
  PdUnit(Engine& engine, PdTransport& t, const PdUnitOptions& o)
      : engine_(engine), transport_(t), options_(o) {}
  void heartbeat_loop(const std::string& router);
  void sweep_kept();  // cancels keyed requests unread past the grace, drops expired outputs
  Status post(const std::string& router, const std::string& path, const std::string& body,
              int* status, std::string* reply = nullptr);

  Engine& engine_;
  PdTransport& transport_;
  PdUnitOptions options_;
  UnitInfo info_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> drain_requested_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool deregistered_ = false;
  std::vector<std::thread> heartbeats_;  // one per router
  std::thread sweeper_;
  // Keyed decode requests by Idempotency-Key; each KeptStream has its own lock.
  std::mutex kept_mu_;
  std::map<std::string, std::shared_ptr<KeptStream>> kept_;  // guarded by kept_mu_
};

}  // namespace moeserve
