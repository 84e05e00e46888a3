// Tracer: Chrome trace events (the JSON that Perfetto and chrome://tracing open), for seeing
// where a step's time goes, one track per (rank, lane): lane 0 computes, lane 1 communicates,
// like DeepSeek's profile-data.
//
// Owned by whoever profiles (a command with --trace); components take a Tracer* that may be
// null (then nothing is recorded and a Span costs one branch). add() and Span may be used from
// any thread; write() once at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace moeserve {

enum class TraceLane { kCompute = 0, kComm = 1 };

class Tracer {
 public:
  explicit Tracer(int rank = 0) : rank_(rank), start_(std::chrono::steady_clock::now()) {}

  // Microseconds since the tracer was made.
  double now_us() const;
  void add(std::string name, TraceLane lane, double begin_us, double end_us);
  // Writes {"traceEvents": [...]} with complete ("X") events and track names.
  Status write(const std::string& path) const;
  size_t size() const;

 private:
  struct Event {
    std::string name;
    TraceLane lane;
    double begin_us, end_us;
  };
  int rank_;
  std::chrono::steady_clock::time_point start_;
  mutable std::mutex mu_;
  std::vector<Event> events_;  // guarded by mu_
};

// Records [construction, destruction) as one event when tracer is non-null, named
// "name index" when an index (e.g. the layer) is given.
class TraceSpan {
 public:
  TraceSpan(Tracer* tracer, const char* name, int64_t index = -1,
            TraceLane lane = TraceLane::kCompute)
      : tracer_(tracer),
        name_(name),
        index_(index),
        lane_(lane),
        begin_(tracer ? tracer->now_us() : 0) {}
  ~TraceSpan() {
    if (!tracer_) return;
    std::string name = index_ >= 0 ? std::string(name_) + " " + std::to_string(index_) : name_;
    tracer_->add(std::move(name), lane_, begin_, tracer_->now_us());
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Tracer* tracer_;
  const char* name_;
  int64_t index_;
  TraceLane lane_;
  double begin_;
};

}  // namespace moeserve
