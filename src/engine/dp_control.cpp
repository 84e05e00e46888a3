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

DpControl::~DpControl() {
  stop_pulls_.store(true);
  for (Pull& p : pulls_) p.thread.join();
}

void DpControl::set_pd(PdHooks hooks, std::function<Status(const EngineRequest&)> validate,
                       std::function<void()> wake) {
  pd_ = std::move(hooks);
  validate_resume_ = std::move(validate);
  wake_ = std::move(wake);
}

void DpControl::start_local(EngineRequest r, Route route) {
  if (!r.resume_from.empty() && !r.resume) {  // its KV first: pulled on a thread of its own
    Pull& p = pulls_.emplace_back();
    p.request = std::move(r);
    p.route = std::move(route);
    p.thread = std::thread([this, &p] {
      p.result = pd_.pull ? pd_.pull(p.request.resume_from, p.request.resume_handle, &stop_pulls_)
                          : Result<std::shared_ptr<KvHandoff>>(
                                Unimplemented("this engine cannot pull hand-offs"));
      p.done.store(true);
      finished_pulls_.fetch_add(1);
      if (wake_) wake_();
    });
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
  for (auto it = pulls_.begin(); it != pulls_.end();) {
    Pull& p = *it;
    if (!p.done.load()) {
      ++it;
      continue;
    }
    p.thread.join();
    finished_pulls_.fetch_sub(1);
    RequestOutput end;
    end.finished = true;
    end.prompt_tokens = int64_t(p.request.prompt.size());
    Status st = p.result.ok() ? Status::Ok() : p.result.status();
    if (p.result.ok()) {
      st = extend_handoff(**p.result, p.request.resume_generated, p.request.sampling);
      p.request.resume = std::move(*p.result);
      if (st.ok() && validate_resume_) st = validate_resume_(p.request);
    }
    if (p.cancelled) {
      end.finish_reason = FinishReason::kCancelled;
      if (before_finish_) before_finish_();
      p.route(p.request.id, end);
    } else if (!st.ok()) {
      end.finish_reason = FinishReason::kError;
      end.error = st;
      if (before_finish_) before_finish_();
      p.route(p.request.id, end);
    } else {
      add_to_core(std::move(p.request), std::move(p.route));
    }
    it = pulls_.erase(it);
  }
}

void DpControl::cancel_local(const std::string& id) {
  for (Pull& p : pulls_) {
    if (p.request.id == id) p.cancelled = true;
  }
  core_.cancel(id);
}

void DpControl::end_pulls(FinishReason reason, const Status& error) {
  stop_pulls_.store(true);
  for (Pull& p : pulls_) p.thread.join();
  for (Pull& p : pulls_) {
    RequestOutput end;
    end.finished = true;
    end.finish_reason = reason;
    end.error = error;
    end.prompt_tokens = int64_t(p.request.prompt.size());
    p.route(p.request.id, end);
  }
  pulls_.clear();
  finished_pulls_.store(0);
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
  const bool loading = !core_.scheduler().loading().empty() || !pulls_.empty();
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
    const EngineStats& o = rank_stats_[size_t(p)];
    s.running += o.running;
    s.waiting += o.waiting;
    s.loading += o.loading;
    s.kv_blocks_used += o.kv_blocks_used;
    s.kv_blocks_total += o.kv_blocks_total;
    s.prefix_queries += o.prefix_queries;
    s.prefix_hits += o.prefix_hits;
    s.prefix_hits_disk += o.prefix_hits_disk;
    s.prompt_tokens += o.prompt_tokens;
    s.generated_tokens += o.generated_tokens;
    s.preemptions += o.preemptions;
    s.kv_disk_hit_blocks += o.kv_disk_hit_blocks;
    s.kv_disk_miss_blocks += o.kv_disk_miss_blocks;
    for (size_t r = 0; r < s.kv_disk_rejected.size(); ++r) {
      s.kv_disk_rejected[r] += o.kv_disk_rejected[r];
    }
    s.kv_disk_written += o.kv_disk_written;
    s.kv_disk_write_drops += o.kv_disk_write_drops;
    s.kv_disk_write_errors += o.kv_disk_write_errors;
    s.kv_disk_writes_off += o.kv_disk_writes_off;
    s.kv_disk_evicted += o.kv_disk_evicted;
    s.kv_disk_bytes_read += o.kv_disk_bytes_read;
    s.kv_disk_bytes_written += o.kv_disk_bytes_written;
    for (size_t k = 0; k < s.spec_verified.size(); ++k) {
      s.spec_verified[k] += o.spec_verified[k];
      s.spec_accepted[k] += o.spec_accepted[k];
    }
    s.spec_verify_steps += o.spec_verify_steps;
    s.spec_verify_tokens += o.spec_verify_tokens;
    s.spec_off_steps += o.spec_off_steps;
    s.grammar_tokens += o.grammar_tokens;
    s.grammar_ns += o.grammar_ns;
  }
  return s;
}

}  // namespace moeserve
