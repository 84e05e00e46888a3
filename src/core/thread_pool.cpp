#include "core/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moeserve {

namespace {

// A step of the forward pass issues hundreds of short parallel_for calls; waking a sleeping
// worker through the condition variable costs tens of microseconds each time. Workers and the
// caller therefore spin this many pause instructions (~50 us) before they block.
constexpr int kSpinIterations = 20000;

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

void chunk_range(int64_t n, int chunks, int index, int64_t* b, int64_t* e) {
  *b = n * index / chunks;
  *e = n * (index + 1) / chunks;
}

}  // namespace

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

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  int chunks =
      int(std::min<int64_t>(size(), std::max<int64_t>(1, n / std::max<int64_t>(1, grain))));
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    pending_.store(chunks - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  int64_t b, e;
  chunk_range(n, chunks, 0, &b, &e);
  fn(b, e);
  for (int spin = 0; spin < kSpinIterations && pending_.load(std::memory_order_acquire) != 0;
       ++spin) {
    cpu_relax();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    for (int spin = 0;
         spin < kSpinIterations && generation_.load(std::memory_order_acquire) == seen; ++spin) {
      cpu_relax();
    }
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    int chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock,
                     [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
      seen = generation_.load(std::memory_order_acquire);
      job = job_;
      n = job_n_;
      chunks = job_chunks_;
    }
    if (index < chunks) {
      int64_t b, e;
      chunk_range(n, chunks, index, &b, &e);
      (*job)(b, e);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_);  // pairs with the caller's predicate check
        done_cv_.notify_one();
      }
    }
  }
}

}  // namespace moeserve
