// ServerMetrics: the counters and latency histograms of one server, rendered with the engine's
// gauges in the Prometheus text exposition format (version 0.0.4) for GET /metrics.
//
// Every method is thread-safe (HTTP worker threads record; /metrics renders). Each server owns
// its own instance: no process-global registry.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"

namespace moeserve {

// A Prometheus histogram with fixed upper bounds (ascending; +Inf is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends the HELP/TYPE lines, the cumulative buckets, _sum and _count.
  void render(std::string& out, std::string_view name, std::string_view help) const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // guarded by mu_; per bucket (not cumulative), last is +Inf
  double sum_ = 0;                // guarded by mu_
  uint64_t count_ = 0;            // guarded by mu_
};

class ServerMetrics {
 public:
  ServerMetrics();

  // One HTTP reply on an API route with its status code.
  void count_reply(int http_status);
  // One choice finished: "stop", "length", "abort" or "error".
  void count_finish(std::string_view reason);
  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token(double seconds) { itl_.observe(seconds); }
  void observe_e2e(double seconds) { e2e_.observe(seconds); }

  std::string render(const EngineStats& engine) const;

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> replies_;                        // guarded by mu_
  std::map<std::string, uint64_t, std::less<>> finishes_;  // guarded by mu_
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
};

}  // namespace moeserve
