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
#include "core/trace.h"
#include "engine/rank_messages.h"
#include "ep/communicator.h"
#include "ep/dispatcher.h"
#include "ep/expert_balancer.h"
#include "model/checkpoint.h"
#include "model/expert_store.h"

namespace moeserve {

namespace {

class LlmEngine final : public Engine {
 public:
  LlmEngine(const EngineOptions& o, const EngineParallel* par, std::unique_ptr<Checkpoint> ck,
            int32_t num_blocks)
      : options_(o),
        ck_(std::move(ck)),
        config_(ck_->config()),
        comm_(par && par->comm && par->comm->size() > 1 ? par->comm : nullptr),
        rank_(comm_ ? comm_->rank() : 0),
        n_ranks_(comm_ ? comm_->size() : 1),
        heartbeat_(par ? par->idle_heartbeat : std::chrono::milliseconds(200)),
        balancer_(par ? par->balancer : nullptr),
        on_clean_stop_(par ? par->on_clean_stop : nullptr),
        pool_(o.threads),
        local_dispatcher_(config_.n_routed_experts, /*bf16_rows=*/o.compute == ComputePath::kFast),
        model_(config_, ck_->weights(),
               par && par->dispatcher ? *par->dispatcher : local_dispatcher_, &pool_, o.attention,
               o.compute, o.overlap, o.progress),
        cache_(config_.num_hidden_layers, config_.kv_cache_dim(), num_blocks, o.kv_dtype),
        blocks_(num_blocks),
        scheduler_({o.max_num_seqs, o.max_batch_tokens}, blocks_),
        max_context_(o.max_model_len > 0
                         ? std::min(o.max_model_len, config_.max_position_embeddings)
                         : config_.max_position_embeddings),
        outstanding_(size_t(n_ranks_), 0),
        rank_stats_(size_t(n_ranks_)),
        thread_([this] { loop(); }) {
    model_.set_tracer(o.tracer);
    model_.set_overlap_min_tokens(o.overlap_min_tokens);
  }

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
    if (rank_ != 0) return Unavailable("requests are submitted to rank 0 of the EP group");
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || stopped_ || !healthy_) return Unavailable("the engine has stopped");
      if (int64_t(incoming_.size()) + waiting_count_ >= options_.max_waiting) {
        return ResourceExhausted(fmt::format("too many queued requests (limit {})", options_.max_waiting));
      }
      // Picked here, not on the serving rank, so the request's samples do not depend on it.
      if (!r.seed) r.seed = seed_source_();
      incoming_.push_back({std::move(r), std::move(cb)});
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
    return healthy_ && !stop_ && !stopped_;
  }
  Status failure() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_context() const override { return max_context_; }

 private:
  struct Submission {
    EngineRequest request;
    OutputCallback callback;
  };
  // Rank 0's record of a request it accepted, wherever it runs.
  struct FrontRequest {
    int rank = 0;
    OutputCallback callback;
    int64_t outstanding = 0;  // tokens still counted against its rank
  };

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
    if (r.top_logprobs > 0 && !r.logprobs) return InvalidArgument("top_logprobs needs logprobs");
    return Status::Ok();
  }

  void loop() {
    Status failed;
    if (balancer_) balancer_->set_expert_host(std::make_unique<ModelExpertHost>(model_));
    try {
      failed = run();
    } catch (const std::exception& e) {
      failed = Internal(std::string("engine step failed: ") + e.what());
    }
    if (balancer_) balancer_->set_expert_host(nullptr);
    if (!failed.ok()) fail_all(failed);
    std::vector<Submission> never_started;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
      never_started.swap(incoming_);
    }
    for (Submission& s : never_started) {
      RequestOutput out;
      out.finished = true;
      out.finish_reason = failed.ok() ? FinishReason::kCancelled : FinishReason::kError;
      out.error = failed;
      out.prompt_tokens = int64_t(s.request.prompt.size());
      s.callback(out);
    }
  }

  // Adds a request to this rank's scheduler; its outputs go to `callback`.
  void start_local(EngineRequest r, OutputCallback callback) {
    auto s = std::make_unique<Sequence>();
    s->tokens = r.prompt;
    s->n_prompt = int64_t(r.prompt.size());
    s->rng.seed(*r.seed);
    s->arrival = std::chrono::steady_clock::now();
    s->req = std::move(r);
    s->callback = std::move(callback);
    live_[s->req.id] = s.get();
    scheduler_.add(std::move(s));
  }

  void cancel_local(const std::string& id) {
    auto it = live_.find(id);
    if (it != live_.end()) finish(it->second, FinishReason::kCancelled, {}, Status::Ok());
  }

  // Rank 0: hands one output of request `id` to its caller and keeps the load count.
  void deliver(const std::string& id, const RequestOutput& out) {
    auto it = front_.find(id);
    if (it == front_.end()) return;
    FrontRequest& f = it->second;
    int64_t done = out.finished ? f.outstanding : std::min<int64_t>(f.outstanding, int64_t(out.tokens.size()));
    f.outstanding -= done;
    outstanding_[size_t(f.rank)] -= done;
    if (!out.finished) {
      f.callback(out);  // callbacks never re-enter the engine (but cancel()), front_ stays put
      return;
    }
    OutputCallback cb = std::move(f.callback);
    front_.erase(it);
    cb(out);
  }

  // Rank 0: where a new request runs (the rank with the fewest outstanding tokens).
  int assign(const EngineRequest& r) {
    int best = 0;
    for (int p = 1; p < n_ranks_; ++p) {
      if (outstanding_[size_t(p)] < outstanding_[size_t(best)]) best = p;
    }
    int64_t cost = int64_t(r.prompt.size()) + r.max_tokens;
    outstanding_[size_t(best)] += cost;
    return best;
  }

  // Rank 0: takes submissions and cancellations, waiting for them while the whole group is idle
  // (at most a heartbeat when there are other ranks). Requests for other ranks and their
  // cancellations land in to_rank. Returns false when stopping.
  bool front_intake(std::vector<FrontMessage>* to_rank) {
    std::vector<Submission> incoming;
    std::vector<std::string> cancels;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // With other ranks, group_busy_ says whether anyone stepped or has outputs to send at the
      // last agreement: a group whose sequences all wait for KV blocks naps a heartbeat
      // instead of spinning through exchanges.
      auto ready = [&] {
        return stop_ || !incoming_.empty() || !cancels_.empty() ||
               (comm_ ? group_busy_
                      : !scheduler_.running().empty() || !scheduler_.waiting().empty());
      };
      if (comm_) {
        cv_.wait_for(lock, heartbeat_, ready);
      } else {
        cv_.wait(lock, ready);
      }
      stopping = stop_;
      incoming.swap(incoming_);
      cancels.swap(cancels_);
    }
    if (stopping) {
      if (to_rank) for (FrontMessage& m : *to_rank) m.stop = true;
      for (Submission& s : incoming) {  // accepted just before the stop: they end here
        RequestOutput out;
        out.finished = true;
        out.finish_reason = FinishReason::kCancelled;
        out.prompt_tokens = int64_t(s.request.prompt.size());
        s.callback(out);
      }
      return false;
    }
    for (Submission& s : incoming) {
      int rank = assign(s.request);
      std::string id = s.request.id;
      front_[id] = {rank, std::move(s.callback), int64_t(s.request.prompt.size()) + s.request.max_tokens};
      if (rank == 0) {
        start_local(std::move(s.request), [this, id](const RequestOutput& o) { deliver(id, o); });
      } else {
        (*to_rank)[size_t(rank)].requests.push_back(std::move(s.request));
      }
    }
    for (const std::string& id : cancels) {
      auto it = front_.find(id);
      if (it == front_.end()) continue;
      if (it->second.rank == 0) {
        cancel_local(id);
      } else {
        (*to_rank)[size_t(it->second.rank)].cancels.push_back(id);
      }
    }
    return true;
  }

  // The control exchange of one step (ranks > 1): rank 0 sends requests, cancellations and the
  // stop flag; the others send their outputs and statistics. Returns false when stopping.
  Result<bool> sync_ranks() {
    TraceSpan span(options_.tracer, "control", -1, TraceLane::kComm);
    std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n_ranks_));
    bool go_on = true;
    if (rank_ == 0) {
      std::vector<FrontMessage> to_rank(static_cast<size_t>(n_ranks_));
      go_on = front_intake(&to_rank);
      for (int p = 1; p < n_ranks_; ++p) out[size_t(p)] = encode(to_rank[size_t(p)]);
    } else {
      {
        // A worker told to stop on its own (rank 0 has not stopped the group) leaves it: the
        // group is broken, and rank 0 learns it from its next exchange's timeout.
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return Unavailable(fmt::format("rank {} was stopped", rank_));
      }
      RankMessage m;
      m.outputs.swap(outbox_);
      m.stats = local_stats();
      out[0] = encode(m);
    }
    ASSIGN_OR_RETURN(std::vector<std::vector<uint8_t>> in, exchange_control(*comm_, out));
    if (rank_ == 0) {
      for (int p = 1; p < n_ranks_; ++p) {
        ASSIGN_OR_RETURN(RankMessage m, decode_rank(in[size_t(p)]));
        rank_stats_[size_t(p)] = m.stats;
        for (auto& [id, o] : m.outputs) deliver(id, o);
      }
      return go_on;
    }
    ASSIGN_OR_RETURN(FrontMessage m, decode_front(in[0]));
    for (EngineRequest& r : m.requests) {
      std::string id = r.id;
      if (!r.seed) return Corrupt(fmt::format("request '{}' reached rank {} without a seed", id, rank_));
      start_local(std::move(r), [this, id](const RequestOutput& o) { outbox_.emplace_back(id, o); });
    }
    for (const std::string& id : m.cancels) cancel_local(id);
    return !m.stop;
  }

  Status run() {
    std::vector<float> logits;
    while (true) {
      if (comm_) {
        ASSIGN_OR_RETURN(bool go_on, sync_ranks());
        if (!go_on) break;
      } else if (!front_intake(nullptr)) {
        break;
      }
      std::vector<ScheduledSeq> plan = scheduler_.schedule();
      publish_stats();
      if (comm_) {
        // Every rank steps when any has work: the MoE exchanges are collective.
        TraceSpan span(options_.tracer, "agree", -1, TraceLane::kComm);
        int64_t mine[2] = {int64_t(!plan.empty()), int64_t(!outbox_.empty())};
        std::vector<int64_t> all(size_t(2 * n_ranks_));
        RETURN_IF_ERROR(comm_->all_gather(mine, all));
        int64_t stepping = 0, busy = 0;
        for (int p = 0; p < n_ranks_; ++p) {
          stepping += all[size_t(2 * p)];
          busy += all[size_t(2 * p + 1)];
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          group_busy_ = stepping > 0 || busy > 0;
        }
        if (stepping == 0) continue;
      } else if (plan.empty()) {
        continue;  // e.g. waiting for blocks that cannot be freed yet
      }
      std::vector<StepSequence> batch;
      for (const ScheduledSeq& p : plan) {
        Sequence& s = *p.seq;
        batch.push_back({std::span<const int32_t>(s.tokens).subspan(size_t(s.n_computed), size_t(p.n_tokens)),
                         s.n_computed, s.block_table, p.want_logits});
      }
      Status st;
      {
        TraceSpan span(options_.tracer, "step", steps_);
        st = model_.forward(batch, cache_, &logits);
      }
      if (!st.ok()) {
        // With other ranks the group is out of step (or a peer is gone): stop serving.
        if (comm_) return st;
        for (const ScheduledSeq& p : plan) finish(p.seq, FinishReason::kError, {}, st);
        continue;
      }
      scheduler_.complete(plan);
      // Sampling (and log-softmax over the vocabulary for requests that want logprobs), the rows
      // in parallel: each row uses only its own sequence's sampler state, so the results do not
      // depend on the split.
      std::vector<Sequence*> sampled;
      for (const ScheduledSeq& p : plan) {
        if (p.want_logits) sampled.push_back(p.seq);
      }
      std::vector<GeneratedToken> drawn(sampled.size());
      const int64_t V = config_.vocab_size;
      pool_.parallel_for(int64_t(sampled.size()), [&](int64_t i0, int64_t i1) {
        std::vector<float> lp;  // [V], sized on first use
        for (int64_t i = i0; i < i1; ++i) {
          Sequence& s = *sampled[size_t(i)];
          const float* l = &logits[size_t(i * V)];
          int32_t tok = sample_token(l, V, s.req.sampling, s.rng);
          drawn[size_t(i)] = GeneratedToken{tok, 0.0f, {}};
          if (!s.req.logprobs) continue;
          lp.resize(static_cast<size_t>(V));
          log_softmax(l, V, lp.data());
          drawn[size_t(i)].logprob = lp[size_t(tok)];
          if (s.req.top_logprobs > 0) drawn[size_t(i)].top = top_logprobs(lp.data(), V, s.req.top_logprobs);
        }
      });
      for (size_t i = 0; i < sampled.size(); ++i) {
        Sequence& s = *sampled[i];
        GeneratedToken& g = drawn[i];
        const int32_t tok = g.id;
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
      // EPLB: collective on every rank after every step; moves expert weights in the background.
      if (balancer_) RETURN_IF_ERROR(balancer_->end_step().status());
      publish_stats();
    }
    if (on_clean_stop_) RETURN_IF_ERROR(on_clean_stop_());
    // Stopping: whatever is still live ends as cancelled (rank 0 also ends the requests it had
    // handed to other ranks: they stop with it).
    while (!live_.empty()) finish(live_.begin()->second, FinishReason::kCancelled, {}, Status::Ok());
    end_front_requests(FinishReason::kCancelled, Status::Ok());
    return Status::Ok();
  }

  void end_front_requests(FinishReason reason, const Status& error) {
    while (!front_.empty()) {
      RequestOutput out;
      out.finished = true;
      out.finish_reason = reason;
      out.error = error;
      deliver(front_.begin()->first, out);
    }
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
      failure_ = st;
    }
    while (!live_.empty()) finish(live_.begin()->second, FinishReason::kError, {}, st);
    end_front_requests(FinishReason::kError, st);
  }

  EngineStats local_stats() const {
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
    return s;
  }

  // Rank 0 publishes the group's totals (other ranks' figures as of the last exchange).
  void publish_stats() {
    EngineStats s = local_stats();
    if (rank_ == 0) {
      for (int p = 1; p < n_ranks_; ++p) {
        const EngineStats& o = rank_stats_[size_t(p)];
        s.running += o.running;
        s.waiting += o.waiting;
        s.kv_blocks_used += o.kv_blocks_used;
        s.kv_blocks_total += o.kv_blocks_total;
        s.prefix_queries += o.prefix_queries;
        s.prefix_hits += o.prefix_hits;
        s.prompt_tokens += o.prompt_tokens;
        s.generated_tokens += o.generated_tokens;
        s.preemptions += o.preemptions;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = s;
    waiting_count_ = s.waiting;
  }

  EngineOptions options_;
  std::unique_ptr<Checkpoint> ck_;
  const ModelConfig& config_;
  Communicator* const comm_;  // null: a single process
  const int rank_, n_ranks_;
  const std::chrono::milliseconds heartbeat_;
  ExpertBalancer* const balancer_;  // EPLB (may be null); used by the step thread
  const std::function<Status()> on_clean_stop_;
  ThreadPool pool_;
  LocalDispatcher local_dispatcher_;
  DeepseekModel model_;
  LatentKvCache cache_;
  KvBlockManager blocks_;
  Scheduler scheduler_;
  const int64_t max_context_;
  std::random_device seed_source_;  // guarded by mu_

  // Step-thread state.
  std::unordered_map<std::string, Sequence*> live_;  // this rank's sequences
  int64_t prompt_total_ = 0, generated_total_ = 0, steps_ = 0;
  std::unordered_map<std::string, FrontRequest> front_;  // rank 0: every accepted request
  std::vector<int64_t> outstanding_;                     // rank 0: [rank] tokens still to come
  std::vector<EngineStats> rank_stats_;                  // rank 0: [rank] last reported
  std::vector<std::pair<std::string, RequestOutput>> outbox_;  // ranks > 0: for rank 0

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_:
  std::vector<Submission> incoming_;
  std::vector<std::string> cancels_;
  EngineStats stats_;
  int64_t waiting_count_ = 0;
  bool group_busy_ = false;  // at the last agreement some rank stepped or had outputs to send
  bool stop_ = false;
  bool stopped_ = false;  // the step loop has ended
  bool healthy_ = true;
  Status failure_;

  std::thread thread_;  // last: starts after everything above is built
};

}  // namespace

Result<std::unique_ptr<Engine>> make_engine(const EngineOptions& o, const EngineParallel* par) {
  if (par && par->comm && par->comm->size() > 1 && !par->dispatcher) {
    return InvalidArgument("an engine on several ranks needs their expert dispatcher");
  }
  LoadOptions load;
  load.progress = o.progress;
  if (par && par->dispatcher) {
    load.holds_layer_expert = [d = par->dispatcher](int64_t moe_layer, int32_t e) {
      return d->holds_layer_expert(moe_layer, e);
    };
  }
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
  return std::unique_ptr<Engine>(new LlmEngine(o, par, std::move(ck), int32_t(num_blocks)));
}

}  // namespace moeserve
