// PdUnit: what makes a `serve` process a unit of a disaggregated deployment (docs/pd.md): the
// internal routes the router calls, the KV transfer server (prefill side) or puller (decode
// side), and the registration with the router and its heartbeats.
//
//   prefill: POST /pd/v1/prefill runs the request with hand_off, offers the hand-off under a
//            lease on the transfer server and answers the first token and where the KV is.
//   decode:  POST /pd/v1/decode pulls the KV from that prefill unit, resumes the request and
//            streams its outputs (NDJSON, one RequestOutput per line) until it ends.
//   both:    either.
//
// Registration runs on a thread of its own: register, then a heartbeat every interval with the
// engine's load; a router that does not know the unit (it restarted) gets a registration again,
// so units rejoin a restarted router by themselves. The destructor deregisters.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/status.h"
#include "engine/engine.h"
#include "router/pd_protocol.h"
#include "server/http_server.h"
#include "server/openai_service.h"
#include "transfer/kv_transfer.h"

namespace moeserve {

struct PdUnitOptions {
  UnitRole role = UnitRole::kBoth;
  std::string router_url;      // http://host:port; empty: no registration (routes only)
  std::string api_key;         // sent to the router (one key for the deployment); empty: none
  KvTransferOptions transfer;  // prefill side: where the transfer server listens
  PullOptions pull;            // decode side
  std::chrono::milliseconds heartbeat{500};
  // How long POST /pd/v1/prefill waits for the engine (queue and prefill) before it cancels.
  std::chrono::milliseconds prefill_timeout{std::chrono::minutes(10)};
};

class PdUnit {
 public:
  // Starts the transfer server (prefill side); nothing is registered yet.
  static Result<std::unique_ptr<PdUnit>> start(Engine& engine, const PdUnitOptions& options);
  ~PdUnit();
  // The unit's HTTP side listens at `url` (http://host:port as the router reaches it): starts
  // registering and heartbeating (when there is a router).
  void join(const std::string& url);

  // The unit's routes, for HttpServerOptions::routes.
  std::vector<HttpRoute> routes();
  Reply prefill(std::string_view body);
  Reply decode(std::string_view body);
  // Stops taking work (heartbeats say draining) and deregisters; idempotent.
  void drain();
  // Prometheus lines of the transfer (appended to /metrics).
  std::string metrics_text();
  const UnitInfo& info() const { return info_; }

 private:
  PdUnit(Engine& engine, const PdUnitOptions& o) : engine_(engine), options_(o) {}
  void heartbeat_loop();
  Status post(const std::string& path, const std::string& body, int* status,
              std::string* reply = nullptr);

  Engine& engine_;
  PdUnitOptions options_;
  UnitInfo info_;
  std::shared_ptr<UcxContext> ucx_;
  std::unique_ptr<KvTransferServer> transfer_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> pulls_ok_{0}, pulls_failed_{0}, pull_bytes_{0}, pull_us_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool deregistered_ = false;
  std::thread heartbeat_;
};

}  // namespace moeserve
