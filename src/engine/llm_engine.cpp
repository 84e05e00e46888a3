#include "engine/llm_engine.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "cache/disk_tier.h"
#include "cache/kv_cache.h"
#include "core/trace.h"
#include "engine/dp_control.h"
#include "engine/engine_core.h"
#include "ep/communicator.h"
#include "ep/dispatcher.h"
#include "ep/expert_balancer.h"
#include "model/expert_store.h"
#include "model/loaded_model.h"

namespace moeserve {

namespace {

constexpr std::chrono::milliseconds kLoadPoll{1};

class LlmEngine final : public Engine {
 public:
  LlmEngine(const EngineOptions& o, const EngineParallel* par, std::unique_ptr<LoadedModel> m)
      : options_(o),
        loaded_(std::move(m)),
        config_(loaded_->config()),
        heartbeat_(par ? par->idle_heartbeat : std::chrono::milliseconds(200)),
        balancer_(par ? par->balancer : nullptr),
        on_clean_stop_(par ? par->on_clean_stop : nullptr),
        model_(loaded_->model()),
        cache_(loaded_->cache()),
        core_(model_, cache_, {o.max_num_seqs, o.max_batch_tokens}, &loaded_->pool(), o.tracer,
              o.speculative),
        dp_(par ? par->comm : nullptr, core_, o.tracer),
        max_context_(o.max_model_len > 0
                         ? std::min(o.max_model_len, config_.max_position_embeddings)
                         : config_.max_position_embeddings),
        thread_([this] { loop(); }) {
    core_.set_grammar_backend(o.grammar);
    std::lock_guard<std::mutex> lock(mu_);  // (until the first step publishes them)
    if (stats_.steps == 0) stats_.kv_blocks_total = cache_.num_blocks();
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
    if (r.resume && !r.resume_generated.empty()) {  // (a pulled one is extended as it arrives)
      auto h = std::make_shared<KvHandoff>(*r.resume);
      RETURN_IF_ERROR(extend_handoff(*h, r.resume_generated, r.sampling));
      r.resume = std::move(h);
    }
    RETURN_IF_ERROR(validate(r));
    if (dp_.rank() != 0) return Unavailable("requests are submitted to rank 0 of the EP group");
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || stopped_ || !healthy_) return Unavailable("the engine has stopped");
      if (int64_t(incoming_.size()) + waiting_count_ >= options_.max_waiting) {
        return ResourceExhausted(
            fmt::format("too many queued requests (limit {})", options_.max_waiting));
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
  uint64_t kv_fingerprint() const override { return cache_.fingerprint(); }

 private:
  // The engine's boundary: a request is checked here once (the step loop trusts it).
  Status validate(const EngineRequest& r) const {
    RETURN_IF_ERROR(validate_prompt(config_, r.prompt, r.max_tokens, max_context_));
    if (r.max_tokens < 1) return InvalidArgument("max_tokens must be >= 1");
    const int64_t total = int64_t(r.prompt.size()) + r.max_tokens;
    if (blocks_for(total) > cache_.num_blocks()) {
      return InvalidArgument(fmt::format(
          "prompt + max_tokens ({} tokens) needs more KV cache than the server has ({} tokens)",
          total, int64_t(cache_.num_blocks()) * kKvBlockSize));
    }
    if (r.sampling.temperature < 0) return InvalidArgument("temperature must be >= 0");
    if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) {
      return InvalidArgument("top_p must be in (0, 1]");
    }
    if (r.sampling.top_k < 0) return InvalidArgument("top_k must be >= 0");
    if (!(r.sampling.min_p >= 0 && r.sampling.min_p <= 1)) {
      return InvalidArgument("min_p must be in [0, 1]");
    }
    if (!(r.sampling.repetition_penalty > 0)) {
      return InvalidArgument("repetition_penalty must be > 0");
    }
    for (const auto& [t, bias] : r.sampling.logit_bias) {
      if (t < 0 || t >= vocab_size() || !std::isfinite(bias)) {
        return InvalidArgument("logit_bias: a token id out of range or a bias not finite");
      }
    }
    if (r.top_logprobs < 0) return InvalidArgument("top_logprobs must be >= 0");
    if (r.top_logprobs > 0 && !r.logprobs) return InvalidArgument("top_logprobs needs logprobs");
    if (r.grammar) {
      if (!options_.grammar) return Unimplemented("this engine has no grammar backend");
      if (r.ignore_eos) return InvalidArgument("a grammar ends at EOS: not with ignore_eos");
      RETURN_IF_ERROR(options_.grammar->check(*r.grammar));  // (compiles it into the cache)
    }
    if (r.resume && dp_.multi_rank()) {  // (it cannot travel to another rank: pull instead)
      return Unimplemented("a hand-off given inline to an EP unit of several ranks");
    }
    if (r.hand_off && dp_.multi_rank() && !options_.pd.offer) {
      return Unimplemented("hand-offs from an EP unit of several ranks need PdHooks::offer");
    }
    if (!r.resume_from.empty()) {
      if (r.resume) return InvalidArgument("a request resumes from one hand-off, not two");
      if (r.hand_off) return InvalidArgument("a resumed request cannot be handed off again");
      if (r.resume_handle.empty()) return InvalidArgument("resume_from without resume_handle");
      if (!options_.pd.pull) return Unimplemented("this engine cannot pull hand-offs");
    }
    if (r.resume) RETURN_IF_ERROR(validate_resume(r));
    return Status::Ok();
  }

  // A hand-off from a prefill unit (docs/pd.md): the same model and KV format, and a state
  // this engine can continue.
  Status validate_resume(const EngineRequest& r) const {
    const KvHandoff& h = *r.resume;
    if (r.hand_off) return InvalidArgument("a resumed request cannot be handed off again");
    if (h.fingerprint != cache_.fingerprint()) {
      return InvalidArgument(fmt::format(
          "the hand-off's KV comes from another model or KV format (fingerprint {:016x}, this "
          "unit's {:016x})",
          h.fingerprint, cache_.fingerprint()));
    }
    if (h.block_bytes != cache_.layout().block_bytes()) {
      return InvalidArgument(fmt::format("the hand-off's KV blocks are {} bytes, this unit's {}",
                                         h.block_bytes, cache_.layout().block_bytes()));
    }
    if (h.n_prompt != int64_t(r.prompt.size()) ||
        !std::equal(r.prompt.begin(), r.prompt.end(), h.tokens.begin())) {
      return InvalidArgument("the hand-off is of another prompt");
    }
    if (h.n_generated() < 1 || h.n_computed < 0 || h.n_computed >= int64_t(h.tokens.size())) {
      return InvalidArgument(fmt::format(
          "the hand-off's counts are inconsistent ({} tokens, {} of the prompt, {} computed)",
          h.tokens.size(), h.n_prompt, h.n_computed));
    }
    RETURN_IF_ERROR(
        validate_prompt(config_, h.tokens, r.max_tokens - h.n_generated(), max_context_));
    if (h.n_generated() >= r.max_tokens) {
      return InvalidArgument(
          fmt::format("the hand-off already has max_tokens ({}) tokens", r.max_tokens));
    }
    if (int64_t(h.blocks.size()) != blocks_for(h.n_computed)) {
      return InvalidArgument(fmt::format("the hand-off has {} KV blocks for {} tokens",
                                         h.blocks.size(), h.n_computed));
    }
    const int32_t trim = cache_.window_trim_point(h.n_computed);
    for (size_t b = 0; b < h.blocks.size(); ++b) {
      const size_t want = int32_t(b) < trim ? cache_.layout().main_bytes() : h.block_bytes;
      if (h.blocks[b].size() != want) {
        return InvalidArgument(
            fmt::format("hand-off KV block {} is of the wrong size: {} bytes, not {}", b,
                        h.blocks[b].size(), want));
      }
    }
    std::mt19937_64 rng;
    std::istringstream in(h.rng_state);
    if (!(in >> rng)) return InvalidArgument("the hand-off's sampler state does not parse");
    return Status::Ok();
  }

  void loop() {
    model_.set_tracer(options_.tracer);
    Status failed;
    if (balancer_) balancer_->set_expert_host(std::make_unique<ModelExpertHost>(model_.experts()));
    dp_.set_before_finish([this] { publish_stats(); });
    dp_.set_pd(
        options_.pd, [this](const EngineRequest& r) { return validate_resume(r); },
        [this] {
          { std::lock_guard<std::mutex> lock(mu_); }
          cv_.notify_all();
        });
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

  // The step loop (docs/engine.md): intake and the ranks' control exchange, schedule, the
  // ranks' agreement, the step, EPLB.
  Status run() {
    while (true) {
      dp_.set_local_stats(local_stats());
      ASSIGN_OR_RETURN(bool go_on, dp_.sync(take_intake()));
      if (!go_on) break;
      StepPlan plan = core_.schedule();
      publish_stats();
      ASSIGN_OR_RETURN(bool step, dp_.agree(!plan.empty()));
      stalled_ = !step && !core_.idle();
      if (!step) continue;
      // A failed step ends its requests; with other ranks the group is out of step (or a peer
      // is gone): stop serving.
      if (Status st = core_.run(plan); !st.ok() && dp_.multi_rank()) return st;
      // EPLB: collective on every rank after every step; moves expert weights in the background.
      if (balancer_) RETURN_IF_ERROR(balancer_->end_step().status());
      publish_stats();
    }
    if (on_clean_stop_) RETURN_IF_ERROR(on_clean_stop_());
    // Stopping: whatever is still live ends as cancelled (rank 0 also ends the requests it had
    // handed to other ranks: they stop with it).
    dp_.end_pulls(FinishReason::kCancelled, Status::Ok());
    core_.finish_all(FinishReason::kCancelled, Status::Ok());
    dp_.end_front_requests(FinishReason::kCancelled, Status::Ok());
    return Status::Ok();
  }

  // What callers handed in since the last step, waiting for it while the whole group is idle
  // (at most a heartbeat when there are other ranks, so that the workers' waits tell a quiet
  // group from a dead one). Workers only look at the stop flag.
  Intake take_intake() {
    Intake in;
    std::unique_lock<std::mutex> lock(mu_);
    if (dp_.rank() != 0) {
      in.stop = stop_;
      return in;
    }
    // With other ranks, group_busy() says whether anyone stepped or had outputs to send at the
    // last agreement: a group whose sequences all wait for KV blocks naps a heartbeat instead
    // of spinning through exchanges. One process whose last schedule ran nothing (requests wait
    // for KV blocks, or for a load another request makes) naps kLoadPoll unless a load
    // finishes. While KV loads from the disk tier (here or on any rank) the nap is kLoadPoll: a
    // finished load is seen that soon.
    const Scheduler& sch = core_.scheduler();
    auto ready = [&] {
      return stop_ || !incoming_.empty() || !cancels_.empty() || dp_.has_finished_pull() ||
             (dp_.multi_rank() ? dp_.group_busy()
                               : (stalled_ ? sch.has_finished_load() : sch.has_work()));
    };
    if (dp_.multi_rank()) {
      cv_.wait_for(lock, dp_.group_loading() ? kLoadPoll : heartbeat_, ready);
    } else if (stalled_ || dp_.group_loading()) {
      cv_.wait_for(lock, kLoadPoll, ready);
    } else {
      cv_.wait(lock, ready);
    }
    in.stop = stop_;
    in.submissions.swap(incoming_);
    in.cancels.swap(cancels_);
    return in;
  }

  void fail_all(const Status& st) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      healthy_ = false;
      failure_ = st;
    }
    dp_.end_pulls(FinishReason::kError, st);
    core_.finish_all(FinishReason::kError, st);
    dp_.end_front_requests(FinishReason::kError, st);
  }

  EngineStats local_stats() const {
    const Scheduler& sch = core_.scheduler();
    EngineStats s = core_.stats();
    s.running = int64_t(sch.running().size());
    s.waiting = int64_t(sch.waiting().size());
    s.loading = int64_t(sch.loading().size()) + dp_.pulls_in_flight();
    s.kv_blocks_used = cache_.num_used();
    s.kv_blocks_total = cache_.num_blocks();
    s.kv_window_pages_total = cache_.window_pages();
    s.kv_window_pages_used = cache_.window_pages() - cache_.num_windows_available();
    s.prefix_queries = sch.prefix_queries();
    s.prefix_hits = sch.prefix_hits();
    s.prefix_hits_disk = sch.prefix_hits_lower();
    s.preemptions = sch.preemptions();
    if (const DiskTier* disk = loaded_->disk()) {
      const DiskTierStats d = disk->stats();
      s.kv_disk_hit_blocks = d.hits;
      s.kv_disk_miss_blocks = d.misses;
      static_assert(std::tuple_size_v<decltype(s.kv_disk_rejected)> == kDiskRejectKinds);
      std::copy(d.rejected.begin(), d.rejected.end(), s.kv_disk_rejected.begin());
      s.kv_disk_written = d.written;
      s.kv_disk_write_drops = d.write_drops;
      s.kv_disk_write_errors = d.write_errors;
      s.kv_disk_writes_off = d.writes_disabled ? 1 : 0;
      s.kv_disk_evicted = d.evicted;
      s.kv_disk_bytes_read = d.bytes_read;
      s.kv_disk_bytes_written = d.bytes_written;
    }
    return s;
  }

  // Rank 0 publishes the group's totals (other ranks' figures as of the last exchange).
  void publish_stats() {
    EngineStats s = dp_.group_stats(local_stats());
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = s;
    waiting_count_ = s.waiting;
  }

  EngineOptions options_;
  std::unique_ptr<LoadedModel> loaded_;  // the model, its KV cache, disk tier and threads
  const ModelConfig& config_;
  const std::chrono::milliseconds heartbeat_;
  ExpertBalancer* const balancer_;  // EPLB (may be null); used by the step thread
  const std::function<Status()> on_clean_stop_;
  CausalLm& model_;  // loaded_'s
  KvCache& cache_;   // loaded_'s
  EngineCore core_;  // step-thread state from here to dp_
  DpControl dp_;
  bool stalled_ = false;  // the last schedule ran nothing while requests were live
  const int64_t max_context_;
  std::random_device seed_source_;  // guarded by mu_

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_:
  std::vector<Submission> incoming_;
  std::vector<std::string> cancels_;
  EngineStats stats_;
  int64_t waiting_count_ = 0;
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
  const bool mtp = o.speculative.num_draft_tokens > 0;
  if (o.speculative.num_draft_tokens < 0 ||
      o.speculative.num_draft_tokens > EngineStats::kMaxDraftTokens) {
    return InvalidArgument(
        fmt::format("num_draft_tokens must be in [0, {}]", EngineStats::kMaxDraftTokens));
  }
  if (o.max_num_seqs < 1 || o.max_batch_tokens < 1 || o.max_waiting < 0) {
    return InvalidArgument("max_num_seqs and max_batch_tokens must be >= 1");
  }
  ModelOptions mo = o;
  mo.mtp = mtp;
  mo.kv_window_seqs = o.max_num_seqs;
  mo.kv_window_tokens = o.max_batch_tokens;
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> m,
                   LoadedModel::open(mo, par ? par->dispatcher : nullptr));
  return std::unique_ptr<Engine>(new LlmEngine(o, par, std::move(m)));
}

}  // namespace moeserve
