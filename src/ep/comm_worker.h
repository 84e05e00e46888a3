// CommWorker: a rank's communication thread (dual micro-batch overlap, docs/ep-overlap.md).
//
// The step thread submits jobs (closures that call Dispatcher::dispatch or combine) and gets a
// future for each; one worker thread runs them one after another in submission order. Because
// every rank of the group submits the same sequence of collective calls, the workers of the
// ranks meet in the same collectives, and the step thread can compute one micro-batch while
// the other's dispatch or combine is in flight. The Dispatcher (and its Communicator) is then
// still used by one thread at a time: the worker while jobs are queued or running, the step
// thread only after it has waited for every future it holds (the future's completion orders
// the two threads' accesses).
//
// What a job reads and writes (activation rows, routing ids, the ExpertBatch, the output rows)
// must stay alive and untouched by the submitter until its future is ready. submit() may be
// called by one thread at a time (the step thread). The destructor runs the jobs still queued,
// then joins the thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>

namespace moeserve {

class CommWorker {
 public:
  CommWorker();
  ~CommWorker();
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;

  // Queues fn behind every job submitted before it; the future holds what fn returns.
  template <class F>
  auto submit(F fn) -> std::future<std::invoke_result_t<F>> {
    using T = std::invoke_result_t<F>;
    auto task = std::make_shared<std::packaged_task<T()>>(std::move(fn));
    std::future<T> done = task->get_future();
    push([task] { (*task)(); });
    return done;
  }

 private:
  void push(std::function<void()> job);
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::thread thread_;                       // last: starts after the members above exist
};

}  // namespace moeserve
