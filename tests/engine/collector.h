// Collects one request's outputs from an Engine and lets a test wait for the end.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/engine.h"

namespace moeserve::testing {

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<GeneratedToken> generated;  // with the top logprobs
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  Status error;
  int64_t cached = 0;
  std::shared_ptr<const KvHandoff> handoff;

  OutputCallback callback() {
    return [this](const RequestOutput& o) {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& t : o.tokens) {
        tokens.push_back(t.id);
        logprobs.push_back(t.logprob);
        generated.push_back(t);
      }
      cached = o.cached_prompt_tokens;
      if (o.finished) {
        finished = true;
        reason = o.finish_reason;
        error = o.error;
        handoff = o.handoff;
      }
      cv.notify_all();
    };
  }
  // Until n tokens have come or the request ended; false after 60 s.
  bool wait_tokens(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60),
                       [&] { return tokens.size() >= n || finished; });
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return finished; }));
  }
};

}  // namespace moeserve::testing
