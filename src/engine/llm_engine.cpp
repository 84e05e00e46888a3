#include "engine/llm_engine.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "cache/block_manager.h"
#include "cache/latent_cache.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "engine/scheduler.h"
#include "ep/dispatcher.h"
#include "model/checkpoint.h"

namespace moeserve {

namespace {

class LlmEngine final : public Engine {
 public:
  LlmEngine(const EngineOptions& o, std::unique_ptr<Checkpoint> ck, int32_t num_blocks)
      : options_(o),
        ck_(std::move(ck)),
        config_(ck_->config()),
        pool_(o.threads),
        dispatcher_(config_.n_routed_experts),
        model_(config_, ck_->weights(), dispatcher_, &pool_, o.attention, o.compute),
        cache_(config_.num_hidden_layers, config_.kv_cache_dim(), num_blocks, o.kv_dtype),
        blocks_(num_blocks),
        scheduler_({o.max_num_seqs, o.max_batch_tokens}, blocks_),
        max_context_(o.max_model_len > 0
                         ? std::min(o.max_model_len, config_.max_position_embeddings)
                         : config_.max_position_embeddings),
        thread_([this] { loop(); }) {}

  ~LlmEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  Status submit(EngineRequest r, OutputCallback cb) override {
    RETURN_IF_ERROR(validate(r));
    auto s = std::make_unique<Sequence>();
    s->tokens = r.prompt;
    s->n_prompt = int64_t(r.prompt.size());
    s->rng.seed(r.seed ? *r.seed : seed_source_());
    s->arrival = std::chrono::steady_clock::now();
    s->req = std::move(r);
    s->callback = std::move(cb);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || !healthy_) return Unavailable("the engine has stopped");
      if (int64_t(incoming_.size()) + waiting_count_ >= options_.max_waiting) {
        return ResourceExhausted(fmt::format("too many queued requests (limit {})", options_.max_waiting));
      }
      incoming_.push_back(std::move(s));
    }
    cv_.notify_one();
    return Status::Ok();
  }

  void cancel(const std::string& id) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancels_.push_back(id);
    }
    cv_.notify_one();
  }

  EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  bool healthy() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return healthy_ && !stop_;
  }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_context() const override { return max_context_; }

 private:
  Status validate(const EngineRequest& r) const {
    if (r.prompt.empty()) return InvalidArgument("the prompt is empty");
    for (int32_t t : r.prompt) {
      if (t < 0 || t >= config_.vocab_size) {
        return InvalidArgument(fmt::format("token id {} outside the vocabulary [0, {})", t, config_.vocab_size));
      }
    }
    if (r.max_tokens < 1) return InvalidArgument("max_tokens must be >= 1");
    int64_t total = int64_t(r.prompt.size()) + r.max_tokens;
    if (total > max_context_) {
      return InvalidArgument(fmt::format(
          "prompt ({} tokens) + max_tokens ({}) = {} exceeds the context length ({})",
          r.prompt.size(), r.max_tokens, total, max_context_));
    }
    if (blocks_for(total) > blocks_.num_blocks()) {
      return InvalidArgument(fmt::format(
          "prompt + max_tokens ({} tokens) needs more KV cache than the server has ({} tokens)",
          total, int64_t(blocks_.num_blocks()) * kKvBlockSize));
    }
    if (r.sampling.temperature < 0) return InvalidArgument("temperature must be >= 0");
    if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) return InvalidArgument("top_p must be in (0, 1]");
    if (r.sampling.top_k < 0) return InvalidArgument("top_k must be >= 0");
    if (r.top_logprobs < 0) return InvalidArgument("top_logprobs must be >= 0");
    return Status::Ok();
  }

  void loop() {
    try {
      run();
    } catch (const std::exception& e) {
      fail_all(Internal(std::string("engine step failed: ") + e.what()));
    }
  }

  // Takes submissions and cancellations; returns false when stopping.
  bool intake() {
    std::vector<std::unique_ptr<Sequence>> incoming;
    std::vector<std::string> cancels;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !incoming_.empty() || !cancels_.empty() || !scheduler_.running().empty() ||
               !scheduler_.waiting().empty();
      });
      if (stop_) return false;
      incoming.swap(incoming_);
      cancels.swap(cancels_);
    }
    for (auto& s : incoming) {
      live_[s->req.id] = s.get();
      scheduler_.add(std::move(s));
    }
    for (const std::string& id : cancels) {
      auto it = live_.find(id);
      if (it != live_.end()) finish(it->second, FinishReason::kCancelled, {}, Status::Ok());
    }
    return true;
  }

  void run() {
    std::vector<float> logits, logprobs(size_t(config_.vocab_size));
    while (intake()) {
      std::vector<ScheduledSeq> plan = scheduler_.schedule();
      publish_stats();
      if (plan.empty()) continue;  // e.g. waiting for blocks that cannot be freed yet
      std::vector<StepSequence> batch;
      for (const ScheduledSeq& p : plan) {
        Sequence& s = *p.seq;
        batch.push_back({std::span<const int32_t>(s.tokens).subspan(size_t(s.n_computed), size_t(p.n_tokens)),
                         s.n_computed, s.block_table, p.want_logits});
      }
      Status st = model_.forward(batch, cache_, &logits);
      if (!st.ok()) {
        for (const ScheduledSeq& p : plan) finish(p.seq, FinishReason::kError, {}, st);
        continue;
      }
      scheduler_.complete(plan);
      int64_t row = 0;
      for (const ScheduledSeq& p : plan) {
        if (!p.want_logits) continue;
        Sequence& s = *p.seq;
        const float* l = &logits[size_t(row++ * config_.vocab_size)];
        int32_t tok = sample_token(l, config_.vocab_size, s.req.sampling, s.rng);
        log_softmax(l, config_.vocab_size, logprobs.data());
        GeneratedToken g{tok, logprobs[size_t(tok)], {}};
        if (s.req.top_logprobs > 0) g.top = top_logprobs(logprobs.data(), config_.vocab_size, s.req.top_logprobs);
        s.tokens.push_back(tok);
        ++generated_total_;
        bool stop = (!s.req.ignore_eos && config_.eos_token_id && tok == *config_.eos_token_id) ||
                    std::find(s.req.stop_token_ids.begin(), s.req.stop_token_ids.end(), tok) !=
                        s.req.stop_token_ids.end();
        if (stop) {
          finish(&s, FinishReason::kStop, {g}, Status::Ok());
        } else if (s.n_generated() >= s.req.max_tokens) {
          finish(&s, FinishReason::kLength, {g}, Status::Ok());
        } else {
          RequestOutput out;
          out.tokens.push_back(std::move(g));
          out.prompt_tokens = s.n_prompt;
          out.cached_prompt_tokens = s.n_cached_prompt;
          s.callback(out);
        }
      }
      ++steps_;
      publish_stats();
    }
    // Stopping: whatever is still live ends as cancelled.
    while (!live_.empty()) finish(live_.begin()->second, FinishReason::kCancelled, {}, Status::Ok());
  }

  void finish(Sequence* s, FinishReason reason, std::vector<GeneratedToken> last, Status error) {
    RequestOutput out;
    out.tokens = std::move(last);
    out.finished = true;
    out.finish_reason = reason;
    out.error = std::move(error);
    out.prompt_tokens = s->n_prompt;
    out.cached_prompt_tokens = s->n_cached_prompt;
    live_.erase(s->req.id);
    std::unique_ptr<Sequence> owned = scheduler_.remove(s);
    if (reason != FinishReason::kError) prompt_total_ += s->n_prompt;
    publish_stats();  // before the callback: whoever it wakes sees the request gone
    owned->callback(out);
  }

  void fail_all(const Status& st) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      healthy_ = false;
    }
    while (!live_.empty()) finish(live_.begin()->second, FinishReason::kError, {}, st);
  }

  void publish_stats() {
    EngineStats s;
    s.running = int64_t(scheduler_.running().size());
    s.waiting = int64_t(scheduler_.waiting().size());
    s.kv_blocks_used = blocks_.num_used();
    s.kv_blocks_total = blocks_.num_blocks();
    s.prefix_queries = scheduler_.prefix_queries();
    s.prefix_hits = scheduler_.prefix_hits();
    s.prompt_tokens = prompt_total_;
    s.generated_tokens = generated_total_;
    s.preemptions = scheduler_.preemptions();
    s.steps = steps_;
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = s;
    waiting_count_ = s.waiting;
  }

  EngineOptions options_;
  std::unique_ptr<Checkpoint> ck_;
  const ModelConfig& config_;
  ThreadPool pool_;
  LocalDispatcher dispatcher_;
  DeepseekModel model_;
  LatentKvCache cache_;
  KvBlockManager blocks_;
  Scheduler scheduler_;
  const int64_t max_context_;
  std::random_device seed_source_;

  // Step-thread state.
  std::unordered_map<std::string, Sequence*> live_;
  int64_t prompt_total_ = 0, generated_total_ = 0, steps_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_:
  std::vector<std::unique_ptr<Sequence>> incoming_;
  std::vector<std::string> cancels_;
  EngineStats stats_;
  int64_t waiting_count_ = 0;
  bool stop_ = false;
  bool healthy_ = true;

  std::thread thread_;  // last: starts after everything above is built
};

}  // namespace

Result<std::unique_ptr<Engine>> make_engine(const EngineOptions& o) {
  LoadOptions load;
  load.progress = o.progress;
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ck, Checkpoint::open(o.model_dir, load));
  const ModelConfig& c = ck->config();
  double bytes_per_block = double(c.num_hidden_layers) * kKvBlockSize * double(c.kv_cache_dim()) *
                           double(dtype_size(o.kv_dtype));
  int64_t num_blocks = int64_t(o.kv_cache_gb * 1e9 / bytes_per_block);
  if (num_blocks < 1) {
    return InvalidArgument(fmt::format("--kv-cache-gb {} holds no KV block ({} bytes each)",
                                       o.kv_cache_gb, bytes_per_block));
  }
  if (num_blocks > INT32_MAX) num_blocks = INT32_MAX;
  if (o.max_num_seqs < 1 || o.max_batch_tokens < 1 || o.max_waiting < 0) {
    return InvalidArgument("max_num_seqs and max_batch_tokens must be >= 1");
  }
  return std::unique_ptr<Engine>(new LlmEngine(o, std::move(ck), int32_t(num_blocks)));
}

}  // namespace moeserve
