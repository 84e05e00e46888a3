// ThreadPool: a fixed set of worker threads that run parallel_for ranges.
//
// Owned by whoever creates it (an engine owns one; tests make their own), never global.
// parallel_for may be called from one thread at a time; it blocks until every chunk has run.
// The calling thread works too, so a pool of n threads uses n-1 workers. Between jobs workers
// spin for ~50 us before sleeping, so back-to-back calls (a forward pass makes hundreds) do
// not pay a condition-variable wake-up each.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moeserve {

class ThreadPool {
 public:
  // n_threads <= 0 means one per hardware thread.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) split into at most size() contiguous chunks of at least
  // `grain` items each.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  // Written under mu_ (read lock-free while spinning):
  std::atomic<uint64_t> generation_{0};  // bumped once per parallel_for
  std::atomic<int> pending_{0};          // worker chunks of the current job not yet finished
  // Guarded by mu_:
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  bool stop_ = false;
};

}  // namespace moeserve
