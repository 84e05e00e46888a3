#include "engine/handoff_pulls.h"

namespace moeserve {

HandoffPulls::~HandoffPulls() {
  stop_.store(true);
  for (Pull& p : pulls_) p.thread.join();
}

void HandoffPulls::set(PdHooks hooks, std::function<Status(const EngineRequest&)> validate,
                       std::function<void()> wake) {
  hooks_ = std::move(hooks);
  validate_ = std::move(validate);
  wake_ = std::move(wake);
}

void HandoffPulls::start(EngineRequest r, Route route) {
  Pull& p = pulls_.emplace_back();
  p.request = std::move(r);
  p.route = std::move(route);
  p.thread = std::thread([this, &p] {
    p.result = hooks_.pull ? hooks_.pull(p.request.resume_from, p.request.resume_handle, &stop_)
                           : Result<std::shared_ptr<KvHandoff>>(
                                 Unimplemented("this engine cannot pull hand-offs"));
    p.done.store(true);
    finished_.fetch_add(1);
    if (wake_) wake_();
  });
}

void HandoffPulls::cancel(const std::string& id) {
  for (Pull& p : pulls_) {
    if (p.request.id == id) p.cancelled = true;
  }
}

void HandoffPulls::take_finished(const std::function<void(EngineRequest, Route)>& arrived,
                                 const std::function<void()>& before_finish) {
  for (auto it = pulls_.begin(); it != pulls_.end();) {
    Pull& p = *it;
    if (!p.done.load()) {
      ++it;
      continue;
    }
    p.thread.join();
    finished_.fetch_sub(1);
    RequestOutput end;
    end.finished = true;
    end.prompt_tokens = int64_t(p.request.prompt.size());
    Status st = p.result.ok() ? Status::Ok() : p.result.status();
    if (p.result.ok()) {
      st = extend_handoff(**p.result, p.request.resume_generated, p.request.sampling);
      p.request.resume = std::move(*p.result);
      if (st.ok() && validate_) st = validate_(p.request);
    }
    if (p.cancelled) {
      end.finish_reason = FinishReason::kCancelled;
      if (before_finish) before_finish();
      p.route(p.request.id, end);
    } else if (!st.ok()) {
      end.finish_reason = FinishReason::kError;
      end.error = st;
      if (before_finish) before_finish();
      p.route(p.request.id, end);
    } else {
      arrived(std::move(p.request), std::move(p.route));
    }
    it = pulls_.erase(it);
  }
}

void HandoffPulls::end_all(FinishReason reason, const Status& error) {
  stop_.store(true);
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
  finished_.store(0);
}

}  // namespace moeserve
