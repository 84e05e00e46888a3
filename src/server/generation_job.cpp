#include "server/generation_job.h"

namespace moeserve {

Status GenerationJob::submit(const std::string& id, const EngineRequest& proto, int n) {
  for (int i = 0; i < n; ++i) ids_.push_back(id + "-" + std::to_string(i));
  for (int i = 0; i < n; ++i) {
    EngineRequest r = proto;
    r.id = ids_[size_t(i)];
    if (proto.seed) r.seed = *proto.seed + uint64_t(i);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++live_;
    }
    std::shared_ptr<GenerationJob> self = shared_from_this();
    Status s = engine_.submit(std::move(r), [self, i](const RequestOutput& out) {
      {
        std::lock_guard<std::mutex> lock(self->mu_);
        self->events_.push_back({i, out, std::chrono::steady_clock::now()});
        if (out.finished) --self->live_;
      }
      self->cv_.notify_all();
    });
    if (!s.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        --live_;
      }
      for (int k = 0; k < i; ++k) engine_.cancel(ids_[size_t(k)]);
      return s;
    }
  }
  return Status::Ok();
}

void GenerationJob::wait(std::vector<JobEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (events_.empty()) cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
}

void GenerationJob::cancel_choice(int choice) {
  if (choice >= 0 && size_t(choice) < ids_.size()) engine_.cancel(ids_[size_t(choice)]);
}

void GenerationJob::cancel_all() {
  for (const std::string& id : ids_) engine_.cancel(id);
}

int GenerationJob::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

}  // namespace moeserve
