#include "ep/comm_worker.h"

#include <utility>

namespace moeserve {

CommWorker::CommWorker() : thread_([this] { loop(); }) {}

CommWorker::~CommWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CommWorker::push(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void CommWorker::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left to run
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();  // a packaged_task: exceptions (none expected) land in its future
  }
}

}  // namespace moeserve
