// HandoffPulls: the decode side of a prefill/decode hand-off (docs/pd.md), on the rank that runs
// the request: a request to resume from a prefill unit (EngineRequest::resume_from) waits here
// while its KV is pulled with PdHooks::pull on a thread of its own; once the pull ends, the
// hand-off is extended to where a re-bound request stands (extend_handoff), checked against
// this engine (the validate function) and the request goes on to the engine core, or ends:
// cancelled meanwhile, the pull failed, or the hand-off does not fit.
//
// The prefill side (EngineCore::hand_off, then PdHooks::offer) and the wire (src/transfer,
// src/router/pd_transport.h) are the hand-off's other halves.
//
// Used by the engine's step thread; the pulling threads touch only their own pull and the
// counters, and call `wake` when they end.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/handoff.h"

namespace moeserve {

class HandoffPulls {
 public:
  // Where a request's outputs go (its id, the output).
  using Route = std::function<void(const std::string&, const RequestOutput&)>;

  HandoffPulls() = default;
  ~HandoffPulls();  // stops and joins the pulls still in flight
  HandoffPulls(const HandoffPulls&) = delete;
  HandoffPulls& operator=(const HandoffPulls&) = delete;

  // How hand-offs are pulled (hooks.pull; empty: every pull fails as Unimplemented), whether
  // one fits this engine, and who to wake (from the pulling thread) when a pull ends.
  void set(PdHooks hooks, std::function<Status(const EngineRequest&)> validate,
           std::function<void()> wake);

  // Starts pulling r's hand-off (r.resume_from set, r.resume empty).
  void start(EngineRequest r, Route route);
  // The pull of request `id`, if any, ends as cancelled when it finishes.
  void cancel(const std::string& id);
  // Pulls that ended: each request whose hand-off arrived and fits goes to `arrived` (with
  // r.resume set); the others end through their route, after `before_finish`.
  void take_finished(const std::function<void(EngineRequest, Route)>& arrived,
                     const std::function<void()>& before_finish);
  // Stops every pull; their requests end with `reason` (the engine stops or failed).
  void end_all(FinishReason reason, const Status& error);

  bool has_finished() const { return finished_.load() > 0; }
  int64_t in_flight() const { return int64_t(pulls_.size()); }

 private:
  struct Pull {
    EngineRequest request;
    Route route;
    bool cancelled = false;
    std::atomic<bool> done{false};
    Result<std::shared_ptr<KvHandoff>> result{Internal("pending")};
    std::thread thread;
  };

  PdHooks hooks_;
  std::function<Status(const EngineRequest&)> validate_;
  std::function<void()> wake_;
  std::list<Pull> pulls_;  // requests whose KV is on its way from a prefill unit
  std::atomic<int> finished_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace moeserve
