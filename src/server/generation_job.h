// GenerationJob: the engine requests of one API request (one per choice) and the queue their
// outputs arrive on. The engine's callbacks (on its step thread) only push to the queue; the
// HTTP thread that serves the request pops and does the detokenizing and formatting.
//
// Lifetime: held by shared_ptr; each engine callback holds a reference until its request's final
// output, so the job outlives its HTTP request when a client goes away. The Engine must outlive
// every job. All methods are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace moeserve {

struct JobEvent {
  int choice = 0;
  RequestOutput output;
  std::chrono::steady_clock::time_point at;  // when the engine delivered it
};

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  explicit GenerationJob(Engine& engine) : engine_(engine) {}

  // Submits n engine requests with ids "<id>-<i>" (choice i gets seed + i when a seed is set).
  // On an engine error, cancels the ones already submitted and returns the error.
  Status submit(const std::string& id, const EngineRequest& proto, int n);

  // Moves the queued events to `out` (appending), waiting up to `timeout` when none is queued.
  void wait(std::vector<JobEvent>& out, std::chrono::milliseconds timeout);

  void cancel_choice(int choice);
  void cancel_all();
  // Engine requests that have not yet delivered their final output.
  int live() const;

 private:
  Engine& engine_;
  std::vector<std::string> ids_;  // written only by submit(), before any other call
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobEvent> events_;  // guarded by mu_
  int live_ = 0;                 // guarded by mu_
};

}  // namespace moeserve
