// DpControl: the data-parallel rank protocol of the serving engine, in one place
// (docs/ep-serving.md, docs/engine.md): which rank runs a request, the per-step control
// exchange that carries requests and cancellations out and tokens back, and the agreement that
// makes every rank step when any has work (the MoE exchanges are collective).
//
// One process (no communicator): every request runs here and sync()/agree() only hand work to
// the EngineCore. Several ranks: rank 0 is the front (it assigns each request to the rank with
// the fewest outstanding tokens, prompt + max_tokens - generated, and its callbacks receive
// every rank's tokens); the others are workers fed by the exchange (rank_messages.h).
//
// Used by the engine's step thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/trace.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/handoff_pulls.h"
#include "engine/rank_messages.h"
#include "ep/communicator.h"

namespace moeserve {

struct Submission {
  EngineRequest request;  // validated, seed set
  OutputCallback callback;
};

// What the front took from its callers since the last step.
struct Intake {
  std::vector<Submission> submissions;
  std::vector<std::string> cancels;
  bool stop = false;  // the engine is stopping (submissions then end as cancelled)
};

class DpControl {
 public:
  // comm: the EP group (borrowed), or null for one process.
  DpControl(Communicator* comm, EngineCore& core, Tracer* tracer);

  int rank() const { return rank_; }
  int n_ranks() const { return n_ranks_; }
  bool multi_rank() const { return comm_ != nullptr; }
  // Called (on any rank) just before a local request's final callback: whoever it wakes then
  // sees the request gone from the published statistics.
  void set_before_finish(std::function<void()> f) { before_finish_ = std::move(f); }
  // Prefill/decode hand-offs (docs/pd.md), on the rank that runs the request: a hand-off is
  // offered with hooks.offer (its output then carries the address); a request to resume from a
  // prefill unit waits in HandoffPulls (engine/handoff_pulls.h: pulled with hooks.pull, checked
  // with `validate`) and joins the core when it has arrived. `wake` is called (from the pulling
  // thread) when a pull ends.
  void set_pd(PdHooks hooks, std::function<Status(const EngineRequest&)> validate,
              std::function<void()> wake);
  // Pulls that ended and wait for the next sync() (which starts them or ends them).
  bool has_finished_pull() const { return pulls_.has_finished(); }
  int64_t pulls_in_flight() const { return pulls_.in_flight(); }
  // Ends every pull in flight (stopping): their requests end with `reason`.
  void end_pulls(FinishReason reason, const Status& error) { pulls_.end_all(reason, error); }

  // Before scheduling a step. Rank 0 gives its intake (workers: Intake{} or {stop = true}); the
  // requests and cancellations reach the rank that runs them, outputs of other ranks reach
  // rank 0's callbacks. false: the group stops (a worker told to stop on its own: Unavailable).
  Result<bool> sync(Intake intake);
  // After scheduling: whether the group runs a step (any rank has work).
  Result<bool> agree(bool have_work);
  // At the last agreement some rank stepped or had outputs to send.
  bool group_busy() const { return group_busy_; }
  // At the last agreement some rank had KV loading from the disk tier.
  bool group_loading() const { return group_loading_; }

  // Rank 0: ends every accepted request still open (the engine stops or failed).
  void end_front_requests(FinishReason reason, const Status& error);
  // The group's statistics: this rank's plus (on rank 0) the others' as last reported.
  EngineStats group_stats(EngineStats local) const;
  // Ranks > 0: this rank's statistics for the next exchange.
  void set_local_stats(const EngineStats& s) { local_stats_ = s; }

 private:
  // Rank 0's record of a request it accepted, wherever it runs.
  struct FrontRequest {
    int rank = 0;
    OutputCallback callback;
    int64_t outstanding = 0;  // tokens still counted against its rank
  };

  using Route = HandoffPulls::Route;

  void start_local(EngineRequest r, Route route);
  void add_to_core(EngineRequest r, Route route);
  void take_pulls();
  void cancel_local(const std::string& id);
  bool front_intake(Intake intake, std::vector<FrontMessage>* to_rank);
  void deliver(const std::string& id, const RequestOutput& out);
  int assign(const EngineRequest& r);

  Communicator* const comm_;  // null: a single process
  EngineCore& core_;
  Tracer* const tracer_;
  const int rank_, n_ranks_;
  std::function<void()> before_finish_;
  bool group_busy_ = false;
  bool group_loading_ = false;

  std::unordered_map<std::string, FrontRequest> front_;  // rank 0: every accepted request
  std::vector<int64_t> outstanding_;                     // rank 0: [rank] tokens still to come
  std::vector<EngineStats> rank_stats_;                  // rank 0: [rank] last reported
  std::vector<std::pair<std::string, RequestOutput>> outbox_;  // ranks > 0: for rank 0
  EngineStats local_stats_;                                    // ranks > 0

  PdHooks pd_;
  HandoffPulls pulls_;  // requests whose KV is on its way from a prefill unit
};

}  // namespace moeserve
