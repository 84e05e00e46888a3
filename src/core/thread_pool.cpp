#include "core/thread_pool.h"

#include <algorithm>

namespace moeserve {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

static void chunk_range(int64_t n, int chunks, int index, int64_t* b, int64_t* e) {
  *b = n * index / chunks;
  *e = n * (index + 1) / chunks;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  int chunks = int(std::min<int64_t>(size(), std::max<int64_t>(1, n / std::max<int64_t>(1, grain))));
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    pending_ = chunks - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  int64_t b, e;
  chunk_range(n, chunks, 0, &b, &e);
  fn(b, e);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    int chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      chunks = job_chunks_;
    }
    if (index < chunks) {
      int64_t b, e;
      chunk_range(n, chunks, index, &b, &e);
      (*job)(b, e);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace moeserve
