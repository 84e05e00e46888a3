#include "engine/dp_control.h"

#include <algorithm>

#include <fmt/format.h>

namespace moeserve {

DpControl::DpControl(Communicator* comm, EngineCore& core, Tracer* tracer)
    : comm_(comm && comm->size() > 1 ? comm : nullptr),
      core_(core),
      tracer_(tracer),
      rank_(comm_ ? comm_->rank() : 0),
      n_ranks_(comm_ ? comm_->size() : 1),
      outstanding_(size_t(n_ranks_), 0),
      rank_stats_(size_t(n_ranks_)) {}

void DpControl::set_pd(PdHooks hooks, std::function<Status(const EngineRequest&)> validate,
                       std::function<void()> wake) {
  pulls_.set(hooks, std::move(validate), std::move(wake));
  pd_ = std::move(hooks);
}

void DpControl::start_local(EngineRequest r, Route route) {
  if (!r.resume_from.empty() && !r.resume) {  // its KV first
    pulls_.start(std::move(r), std::move(route));
    return;
  }
  add_to_core(std::move(r), std::move(route));
}

void DpControl::add_to_core(EngineRequest r, Route route) {
  std::string id = r.id;
  core_.add(std::move(r), [this, id, route = std::move(route)](const RequestOutput& o) {
    if (o.finished && before_finish_) before_finish_();
    if (o.handoff && pd_.offer) {  // the hand-off stays on this rank; the address travels
      RequestOutput out = o;
      out.handoff.reset();
      Result<std::string> at = pd_.offer(id, o.handoff);
      if (at.ok()) {
        out.handoff_at = *at;
      } else {
        out.finish_reason = FinishReason::kError;
        out.error = at.status();
      }
      route(id, out);
      return;
    }
    route(id, o);
  });
}

// Pulls that ended: their requests join the core, or end (cancelled while pulling, the pull
// failed, or the hand-off does not fit this engine).
void DpControl::take_pulls() {
  pulls_.take_finished(
      [this](EngineRequest r, Route route) { add_to_core(std::move(r), std::move(route)); },
      before_finish_);
}

void DpControl::cancel_local(const std::string& id) {
  pulls_.cancel(id);
  core_.cancel(id);
}

// Rank 0: hands one output of request `id` to its caller and keeps the load count.
void DpControl::deliver(const std::string& id, const RequestOutput& out) {
  auto it = front_.find(id);
  if (it == front_.end()) return;
  FrontRequest& f = it->second;
  int64_t done =
      out.finished ? f.outstanding : std::min<int64_t>(f.outstanding, int64_t(out.tokens.size()));
  f.outstanding -= done;
  outstanding_[size_t(f.rank)] -= done;
  if (!out.finished) {
    f.callback(out);  // callbacks never re-enter the engine (but cancel()), front_ stays put
    return;
  }
  OutputCallback cb = std::move(f.callback);
  front_.erase(it);
  cb(out);
}

// Rank 0: where a new request runs (the rank with the fewest outstanding tokens).
int DpControl::assign(const EngineRequest& r) {
  int best = 0;
  for (int p = 1; p < n_ranks_; ++p) {
    if (outstanding_[size_t(p)] < outstanding_[size_t(best)]) best = p;
  }
  outstanding_[size_t(best)] += int64_t(r.prompt.size()) + r.max_tokens;
  return best;
}

// Rank 0: starts local requests and cancellations; those of other ranks land in to_rank.
// Returns false when stopping.
bool DpControl::front_intake(Intake in, std::vector<FrontMessage>* to_rank) {
  if (in.stop) {
    for (FrontMessage& m : *to_rank) m.stop = true;
    for (Submission& s : in.submissions) {  // accepted just before the stop: they end here
      RequestOutput out;
      out.finished = true;
      out.finish_reason = FinishReason::kCancelled;
      out.prompt_tokens = int64_t(s.request.prompt.size());
      s.callback(out);
    }
    return false;
  }
  for (Submission& s : in.submissions) {
    int rank = assign(s.request);
    std::string id = s.request.id;
    front_[id] = {rank, std::move(s.callback),
                  int64_t(s.request.prompt.size()) + s.request.max_tokens};
    if (rank == 0) {
      start_local(std::move(s.request),
                  [this](const std::string& id, const RequestOutput& o) { deliver(id, o); });
    } else {
      (*to_rank)[size_t(rank)].requests.push_back(std::move(s.request));
    }
  }
  for (const std::string& id : in.cancels) {
    auto it = front_.find(id);
    if (it == front_.end()) continue;
    if (it->second.rank == 0) {
      cancel_local(id);
    } else {
      (*to_rank)[size_t(it->second.rank)].cancels.push_back(id);
    }
  }
  return true;
}

// The control exchange of one step (ranks > 1): rank 0 sends requests, cancellations and the
// stop flag; the others send their outputs and statistics.
Result<bool> DpControl::sync(Intake intake) {
  std::vector<FrontMessage> to_rank(static_cast<size_t>(n_ranks_));
  if (!comm_) {
    const bool go_on = front_intake(std::move(intake), &to_rank);
    take_pulls();
    return go_on;
  }
  TraceSpan span(tracer_, "control", -1, TraceLane::kComm);
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n_ranks_));
  bool go_on = true;
  if (rank_ == 0) {
    go_on = front_intake(std::move(intake), &to_rank);
    for (int p = 1; p < n_ranks_; ++p) out[size_t(p)] = encode(to_rank[size_t(p)]);
  } else {
    // A worker told to stop on its own (rank 0 has not stopped the group) leaves it: the group
    // is broken, and rank 0 learns it from its next exchange's timeout.
    if (intake.stop) return Unavailable(fmt::format("rank {} was stopped", rank_));
    RankMessage m;
    m.outputs.swap(outbox_);
    m.stats = local_stats_;
    out[0] = encode(m);
  }
  ASSIGN_OR_RETURN(std::vector<std::vector<uint8_t>> in, exchange_control(*comm_, out));
  if (rank_ == 0) {
    for (int p = 1; p < n_ranks_; ++p) {
      ASSIGN_OR_RETURN(RankMessage m, decode_rank(in[size_t(p)]));
      rank_stats_[size_t(p)] = m.stats;
      for (auto& [id, o] : m.outputs) deliver(id, o);
    }
    take_pulls();
    return go_on;
  }
  ASSIGN_OR_RETURN(FrontMessage m, decode_front(in[0]));
  for (EngineRequest& r : m.requests) {
    if (!r.seed) {
      return Corrupt(fmt::format("request '{}' reached rank {} without a seed", r.id, rank_));
    }
    start_local(std::move(r), [this](const std::string& id, const RequestOutput& o) {
      outbox_.emplace_back(id, o);
    });
  }
  for (const std::string& id : m.cancels) cancel_local(id);
  take_pulls();
  return !m.stop;
}

Result<bool> DpControl::agree(bool have_work) {
  const bool loading = !core_.scheduler().loading().empty() || pulls_.in_flight() > 0;
  if (!comm_) {  // e.g. nothing to run: waiting for blocks that cannot be freed, or for KV loads
    group_loading_ = loading;
    return have_work;
  }
  TraceSpan span(tracer_, "agree", -1, TraceLane::kComm);
  int64_t mine[3] = {int64_t(have_work), int64_t(!outbox_.empty()), int64_t(loading)};
  std::vector<int64_t> all(size_t(3 * n_ranks_));
  RETURN_IF_ERROR(comm_->all_gather(mine, all));
  int64_t stepping = 0, busy = 0, loads = 0;
  for (int p = 0; p < n_ranks_; ++p) {
    stepping += all[size_t(3 * p)];
    busy += all[size_t(3 * p + 1)];
    loads += all[size_t(3 * p + 2)];
  }
  group_busy_ = stepping > 0 || busy > 0;
  group_loading_ = loads > 0;
  return stepping > 0;
}

void DpControl::end_front_requests(FinishReason reason, const Status& error) {
  while (!front_.empty()) {
    RequestOutput out;
    out.finished = true;
    out.finish_reason = reason;
    out.error = error;
    deliver(front_.begin()->first, out);
  }
}

EngineStats DpControl::group_stats(EngineStats s) const {
  if (rank_ != 0) return s;
  for (int p = 1; p < n_ranks_; ++p) {
    s += rank_stats_[size_t(p)];
  }
  return s;
}

}  // namespace moeserve
