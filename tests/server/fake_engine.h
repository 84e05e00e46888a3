// FakeEngine: a deterministic Engine for the server's tests. Every request generates the same
// scripted token ids (repeated), one per step, with a configurable step delay; it honours
// max_tokens, EOS (unless ignore_eos), stop_token_ids and cancel(), and records what it was
// asked. Logprobs are made up but well-formed (the chosen token first in `top`).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"

namespace moeserve::testing {

struct FakeEngineOptions {
  std::vector<int32_t> script = {100, 101, 102, 103};  // what every request generates
  std::chrono::milliseconds step_delay{1};
  int64_t vocab_size = 129280;
  int64_t max_context = 1024;
  std::optional<int32_t> eos;
  int64_t tokens_per_step = 1;  // tokens delivered together (as MTP or a hand-off delivers them)
};

class FakeEngine final : public Engine {
 public:
  explicit FakeEngine(FakeEngineOptions o) : o_(std::move(o)), thread_([this] { loop(); }) {}
  ~FakeEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  Status submit(EngineRequest r, OutputCallback cb) override {
    if (r.prompt.empty()) return InvalidArgument("empty prompt");
    for (int32_t id : r.prompt) {
      if (id < 0 || id >= o_.vocab_size) return InvalidArgument("token id out of range");
    }
    if (int64_t(r.prompt.size()) + r.max_tokens > o_.max_context) {
      return InvalidArgument("prompt + max_tokens beyond the context");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!submit_error_.ok()) return submit_error_;
    if (live_.count(r.id)) return InvalidArgument("duplicate id " + r.id);
    submitted_.push_back(r);
    live_[r.id] = Live{r, std::move(cb), 0, false};
    order_.push_back(r.id);
    cv_.notify_all();
    return Status::Ok();
  }

  void cancel(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_calls_.insert(id);
    if (auto it = live_.find(id); it != live_.end()) it->second.cancelled = true;
    cv_.notify_all();
  }

  EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s;
    s.running = int64_t(live_.size());
    s.waiting = 0;
    s.kv_blocks_used = int64_t(live_.size());
    s.kv_blocks_total = 100;
    s.prompt_tokens = prompt_tokens_;
    s.generated_tokens = generated_;
    s.prefix_queries = prompt_tokens_;
    s.prefix_hits = 0;
    s.steps = steps_;
    return s;
  }
  bool healthy() const override { return healthy_.load(); }
  int64_t vocab_size() const override { return o_.vocab_size; }
  int64_t max_context() const override { return o_.max_context; }

  // Test controls and observations.
  void set_healthy(bool h) { healthy_ = h; }
  void set_tokens_per_step(int64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_per_step_ = n;
  }
  void set_submit_error(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    submit_error_ = std::move(s);
  }
  // While paused, no tokens are generated (cancellations still finish requests).
  void set_paused(bool p) {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = p;
    cv_.notify_all();
  }
  std::vector<EngineRequest> submitted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }
  bool was_cancelled(const std::string& id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancel_calls_.count(id) > 0;
  }
  int64_t live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return int64_t(live_.size());
  }
  // Waits (up to `limit`, a generous bound, not a timing assertion) until pred() holds.
  template <typename Pred>
  static bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

 private:
  struct Live {
    EngineRequest req;
    OutputCallback cb;
    int64_t generated = 0;
    bool cancelled = false;
  };

  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !live_.empty(); });
      if (stop_) return;
      lock.unlock();
      std::this_thread::sleep_for(o_.step_delay);
      lock.lock();
      std::vector<std::pair<OutputCallback, RequestOutput>> calls;
      ++steps_;
      for (auto it = order_.begin(); it != order_.end();) {
        Live& l = live_.at(*it);
        RequestOutput out;
        out.prompt_tokens = int64_t(l.req.prompt.size());
        if (l.cancelled) {
          out.finished = true;
          out.finish_reason = FinishReason::kCancelled;
        } else if (!paused_) {
          if (l.generated == 0) prompt_tokens_ += out.prompt_tokens;
          for (int64_t n = 0; n < tokens_per_step_ && !out.finished; ++n) {
            int32_t tok = o_.script[size_t(l.generated) % o_.script.size()];
            ++l.generated;
            ++generated_;
            GeneratedToken g;
            g.id = tok;
            g.logprob = -0.25f;
            for (int64_t k = 0; k < l.req.top_logprobs; ++k) {
              g.top.push_back(
                  {k == 0 ? tok : int32_t((tok + k) % o_.vocab_size), -0.25f - float(k)});
            }
            out.tokens.push_back(g);
            const auto& stops = l.req.stop_token_ids;
            if ((!l.req.ignore_eos && o_.eos && tok == *o_.eos) ||
                std::find(stops.begin(), stops.end(), tok) != stops.end()) {
              out.finished = true;
              out.finish_reason = FinishReason::kStop;
            } else if (l.generated >= l.req.max_tokens) {
              out.finished = true;
              out.finish_reason = FinishReason::kLength;
            }
          }
        } else {
          ++it;
          continue;
        }
        calls.emplace_back(out.finished ? std::move(l.cb) : l.cb, out);
        if (out.finished) {
          live_.erase(*it);
          it = order_.erase(it);
        } else {
          ++it;
        }
      }
      lock.unlock();
      for (auto& [cb, out] : calls) cb(out);  // outside the lock: callbacks may cancel()
      lock.lock();
    }
  }

  const FakeEngineOptions o_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Live> live_;                       // guarded by mu_
  std::vector<std::string> order_;                         // guarded by mu_
  std::vector<EngineRequest> submitted_;                   // guarded by mu_
  std::set<std::string> cancel_calls_;                     // guarded by mu_
  Status submit_error_;                                    // guarded by mu_
  bool paused_ = false;                                    // guarded by mu_
  bool stop_ = false;                                      // guarded by mu_
  int64_t prompt_tokens_ = 0, generated_ = 0, steps_ = 0;  // guarded by mu_
  int64_t tokens_per_step_ = o_.tokens_per_step;           // guarded by mu_
  std::atomic<bool> healthy_{true};
  std::thread thread_;
};

}  // namespace moeserve::testing
