// Engine: the serving loop's interface. A background step thread runs continuous batching over
// the model (chunked prefill, paged KV cache with prefix caching, preemption by recompute);
// callers submit requests from any thread and receive their tokens through a callback.
//
// Threading: submit(), cancel(), stats() and healthy() may be called from any thread. The
// callback of a request is invoked on the engine's step thread, in order, never concurrently
// with itself; it must be quick (push to a queue) and must not call back into the Engine
// except cancel(). After a callback with `finished == true` no further callback comes for that
// request.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/status.h"
#include "engine/grammar.h"
#include "engine/handoff.h"
#include "kernels/sampling.h"

namespace moeserve {

struct EngineRequest {
  std::string id;                // unique among live requests (the server makes it)
  std::vector<int32_t> prompt;   // token ids, non-empty, each < vocab_size
  int64_t max_tokens = 16;       // >= 1
  SamplingParams sampling;       // greedy when temperature == 0
  std::optional<uint64_t> seed;  // nullopt: the engine picks one
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  // besides EOS (unless ignore_eos)
  // false: no log-softmax over the vocabulary per generated token (~8% of a 32-row decode step
  // on the bench model); GeneratedToken::logprob is then 0 and top empty.
  bool logprobs = true;
  int64_t top_logprobs = 0;  // >= 0, 0 unless logprobs; 0: only the chosen token's logprob
  // Constrained decoding (docs/structured-outputs.md): every token sampled under the grammar's
  // mask; the request stops when the grammar ends (at EOS). Needs the engine's GrammarBackend;
  // not with ignore_eos.
  std::optional<GrammarSpec> grammar;
  // Prefill/decode disaggregation (docs/pd.md). hand_off (a prefill unit): once the first token
  // is sampled and the request goes on, it ends with FinishReason::kHandedOff and its state in
  // RequestOutput::handoff instead of decoding here. resume (a decode unit): the request goes on
  // from a prefill unit's hand-off; prompt must equal its prompt, and the callbacks bring the
  // tokens after those it already has.
  bool hand_off = false;
  std::shared_ptr<const KvHandoff> resume;
  // Resume by pulling (with the engine's PdHooks::pull, on the rank that runs the request): the
  // hand-off `resume_handle` at the prefill unit's `resume_from` ("host:port"). While it
  // arrives the request counts as loading; a failed pull ends it with the error.
  std::string resume_from;
  std::string resume_handle;
  // A request re-bound to this unit after its decode unit was lost (docs/fault-tolerance.md):
  // every token the client already has, the hand-off's own first. Those past the hand-off's are
  // appended to it (their KV computed here, the prompt's is not) and the sampler is advanced
  // past them; the callbacks bring the tokens after them. Empty: none past the hand-off's.
  std::vector<int32_t> resume_generated;
  // The client's Idempotency-Key (docs/fault-tolerance.md): a decode unit keeps the outputs of
  // such a request for a router that attaches to it after the first router died. Empty: none.
  std::string idempotency_key;
  // A keyed request that may continue one a decode unit kept (a resumed stream, or a call that
  // may be a retry): a router asks its decode units for it before generating it. A new stream
  // (no Last-Event-ID) is not looked for. Not sent to units.
  bool attach_first = false;
  friend bool operator==(const EngineRequest&, const EngineRequest&) = default;
};

// kHandedOff: the request goes on at another unit (EngineRequest::hand_off).
enum class FinishReason { kLength, kStop, kCancelled, kError, kHandedOff };

struct GeneratedToken {
  int32_t id = 0;
  float logprob = 0.0f;           // of the chosen token, under the model (before temperature);
                                  // computed only when the request's logprobs is set
  std::vector<TokenLogprob> top;  // top_logprobs entries, descending
  friend bool operator==(const GeneratedToken&, const GeneratedToken&) = default;
};

// One callback's worth of progress for one request.
struct RequestOutput {
  std::vector<GeneratedToken> tokens;  // new since the last callback (may be empty at finish)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kLength;  // valid when finished
  Status error;                                        // non-ok only with FinishReason::kError
  int64_t prompt_tokens = 0;                           // set on every callback
  int64_t cached_prompt_tokens = 0;                    // prompt tokens served from the prefix cache
  // MTP speculative decoding (docs/mtp.md), so far: draft tokens verified, and of those accepted.
  int64_t draft_tokens = 0;
  int64_t accepted_draft_tokens = 0;
  // With FinishReason::kHandedOff: the hand-off itself, or, when the engine has PdHooks::offer,
  // the address it was offered at (under the request's id) instead.
  std::shared_ptr<const KvHandoff> handoff;
  std::string handoff_at;
  friend bool operator==(const RequestOutput&, const RequestOutput&) = default;
};

using OutputCallback = std::function<void(const RequestOutput&)>;

struct EngineStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t loading = 0;  // admitted, their KV on its way from the disk tier
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  // The window pool (sliding-window layouts, V4: docs/kv-cache.md); zero without one.
  int64_t kv_window_pages_used = 0;  // held by sequences (cached ones count as free)
  int64_t kv_window_pages_total = 0;
  int64_t prefix_queries = 0;  // prompt tokens looked up in the prefix cache (cumulative)
  int64_t prefix_hits = 0;     // of those, tokens found (cumulative)
  int64_t prompt_tokens = 0;   // cumulative
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;
  // The KV disk tier (zero without one); prefix_hits counts the tokens of both tiers.
  int64_t prefix_hits_disk = 0;     // of prefix_hits, tokens loaded from disk
  int64_t kv_disk_hit_blocks = 0;   // cumulative, as every counter below
  int64_t kv_disk_miss_blocks = 0;  // looked up on disk, not there
  // Objects found but not used (and removed), by reason: [DiskReject] (cache/disk_tier.h).
  std::array<int64_t, 7> kv_disk_rejected{};
  int64_t kv_disk_written = 0;
  int64_t kv_disk_write_drops = 0;  // writes dropped: the writer's queue was full
  int64_t kv_disk_write_errors = 0;
  int64_t kv_disk_writes_off = 0;  // ranks whose tier turned writing off after an error (a gauge)
  int64_t kv_disk_evicted = 0;     // objects removed to keep the size budget
  int64_t kv_disk_bytes_read = 0;
  int64_t kv_disk_bytes_written = 0;
  // MTP speculative decoding (docs/mtp.md), cumulative: per draft position k (the k+1-th
  // draft after a verified token), drafts verified and accepted; steps of a sequence that
  // verified at least one draft, and the tokens those produced (accepted drafts + the bonus).
  static constexpr int kMaxDraftTokens = 3;
  std::array<int64_t, kMaxDraftTokens> spec_verified{};
  std::array<int64_t, kMaxDraftTokens> spec_accepted{};
  int64_t spec_verify_steps = 0;
  int64_t spec_verify_tokens = 0;
  int64_t spec_off_steps = 0;  // decode steps the load policy ran without drafts
  // Constrained decoding, cumulative: tokens sampled under a grammar, and the time spent making
  // and applying their masks and advancing the grammars (summed over the sampling threads).
  int64_t grammar_tokens = 0;
  int64_t grammar_ns = 0;

  // Every field that adds up over an EP group's ranks (all but `steps`: the ranks step
  // together, so the group's steps are any rank's). A new counter is one member here, its
  // entry in this list, and its metric (server/metrics.cpp).
  static constexpr auto fields() {
    using S = EngineStats;
    return std::make_tuple(
        &S::running, &S::waiting, &S::loading, &S::kv_blocks_used, &S::kv_blocks_total,
        &S::prefix_queries, &S::prefix_hits, &S::prompt_tokens, &S::generated_tokens,
        &S::preemptions, &S::prefix_hits_disk, &S::kv_disk_hit_blocks, &S::kv_disk_miss_blocks,
        &S::kv_disk_rejected, &S::kv_disk_written, &S::kv_disk_write_drops,
        &S::kv_disk_write_errors, &S::kv_disk_writes_off, &S::kv_disk_evicted,
        &S::kv_disk_bytes_read, &S::kv_disk_bytes_written, &S::spec_verified, &S::spec_accepted,
        &S::spec_verify_steps, &S::spec_verify_tokens, &S::spec_off_steps, &S::grammar_tokens,
        &S::grammar_ns, &S::kv_window_pages_used, &S::kv_window_pages_total);
  }
  // Adds every field of fields() of `o` (another rank's figures) to this one's.
  EngineStats& operator+=(const EngineStats& o) {
    std::apply([&](auto... f) { (add(this->*f, o.*f), ...); }, fields());
    return *this;
  }
  friend bool operator==(const EngineStats&, const EngineStats&) = default;

 private:
  static void add(int64_t& a, int64_t b) { a += b; }
  template <size_t N>
  static void add(std::array<int64_t, N>& a, const std::array<int64_t, N>& b) {
    for (size_t i = 0; i < N; ++i) a[i] += b[i];
  }
};
// Every member is an int64_t or an array of them (no padding): the listed fields and `steps`
// cover the struct exactly when their sizes add up to it, so a member left out fails here.
static_assert(
    sizeof(EngineStats) ==
        sizeof(int64_t) +
            std::apply([](auto... f) { return (sizeof(std::declval<EngineStats&>().*f) + ...); },
                       EngineStats::fields()),
    "EngineStats::fields() must list every member");

class Engine {
 public:
  virtual ~Engine() = default;

  // Queues a request. Errors: InvalidArgument (bad fields, prompt + max_tokens beyond the
  // context), ResourceExhausted (admission limits: too many waiting requests),
  // Unavailable (the engine has stopped).
  virtual Status submit(EngineRequest request, OutputCallback callback) = 0;
  // Stops a request soon (its callback then gets finished with kCancelled). Unknown ids and
  // finished requests are ignored.
  virtual void cancel(const std::string& id) = 0;
  virtual EngineStats stats() const = 0;
  // False once the step thread has died or stopped.
  virtual bool healthy() const = 0;
  // Why the step thread died (OK while it runs and after a clean stop).
  virtual Status failure() const { return Status::Ok(); }
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_context() const = 0;
  // The KV cache's fingerprint (docs/engine.md "The block owner"): engines whose KV may move
  // between them (prefill/decode hand-off, a shared disk tier) have equal ones.
  virtual uint64_t kv_fingerprint() const { return 0; }
};

}  // namespace moeserve
