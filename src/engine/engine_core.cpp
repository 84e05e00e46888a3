#include "engine/engine_core.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "core/check.h"
#include "kernels/sampling.h"

namespace moeserve {

Status validate_prompt(const ModelConfig& c, std::span<const int32_t> prompt, int64_t max_tokens,
                       int64_t max_context) {
  if (prompt.empty()) return InvalidArgument("the prompt is empty");
  for (int32_t t : prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return InvalidArgument(
          fmt::format("token id {} outside the vocabulary [0, {})", t, c.vocab_size));
    }
  }
  const int64_t total = int64_t(prompt.size()) + max_tokens;
  if (total > max_context) {
    return InvalidArgument(
        fmt::format("prompt ({} tokens) + max_tokens ({}) = {} exceeds the context length ({})",
                    prompt.size(), max_tokens, total, max_context));
  }
  return Status::Ok();
}

Status ModelRunner::run(const StepPlan& plan, StepResult* result) {
  std::vector<StepSequence> batch;
  batch.reserve(plan.seqs.size());
  rows_with_drafts_.resize(plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const PlannedSeq& p = plan.seqs[i];
    const Sequence& s = *p.seq;
    std::span<const int32_t> tokens =
        std::span<const int32_t>(s.tokens).subspan(size_t(s.n_computed), size_t(p.n_tokens));
    if (!p.drafts.empty()) {  // [n_tokens + drafts] in one buffer
      std::vector<int32_t>& row = rows_with_drafts_[i];
      row.assign(tokens.begin(), tokens.end());
      row.insert(row.end(), p.drafts.begin(), p.drafts.end());
      tokens = row;
    }
    batch.push_back(
        {tokens, s.n_computed, s.block_table, p.n_logits, all_hidden_ ? p.n_rows() : 0});
  }
  RETURN_IF_ERROR(model_.forward(batch, cache_, &out_));
  std::swap(result->logits, out_.logits);
  std::swap(result->hidden, out_.hidden);
  return Status::Ok();
}

EngineCore::EngineCore(CausalLm& model, KvCache& cache, const SchedulerConfig& scheduling,
                       ThreadPool* pool, Tracer* tracer, const SpeculativeConfig& speculative)
    : model_(model),
      cache_(cache),
      pool_(pool),
      tracer_(tracer),
      scheduler_(scheduling, cache),
      runner_(model, cache, speculative.num_draft_tokens > 0),
      spec_(speculative),
      policy_(speculative.num_draft_tokens) {
  const int64_t K = spec_.num_draft_tokens;
  CHECK(K >= 0 && K <= EngineStats::kMaxDraftTokens, "num_draft_tokens outside [0, 3]");
  CHECK(K == 0 || (model.has_mtp() && cache.layout().n_layers == model.num_layers()),
        "speculative decoding needs the MTP module and its cache layer");
}

void EngineCore::add(EngineRequest r, OutputCallback callback) {
  CHECK(r.seed.has_value(), "a request reaches the engine core with its seed set");
  auto s = std::make_unique<Sequence>();
  s->tokens = r.prompt;
  s->n_prompt = int64_t(r.prompt.size());
  s->rng.seed(*r.seed);
  if (r.resume) {  // (validated by the caller: its prompt is r.prompt, its rng state parses)
    s->tokens = r.resume->tokens;
    s->n_cached_prompt = r.resume->n_cached_prompt;
    s->admitted_before = true;  // (its prefix lookup was counted where it was prefilled)
    std::istringstream(r.resume->rng_state) >> s->rng;
    s->import = std::move(r.resume);
  }
  Status grammar_error;
  if (r.grammar) {  // (checked at the engine's boundary; this compiles only on other EP ranks)
    Result<std::unique_ptr<TokenConstraint>> c =
        grammar_ ? grammar_->start(*r.grammar)
                 : Result<std::unique_ptr<TokenConstraint>>(
                       Unimplemented("this engine has no grammar backend"));
    if (c.ok()) {
      s->constraint = std::move(*c);
      // A resumed request's generated tokens are past already (docs/pd.md).
      for (size_t i = r.prompt.size(); i < s->tokens.size() && grammar_error.ok(); ++i) {
        if (!s->constraint->accept(s->tokens[i])) {
          grammar_error = InvalidArgument("the hand-off's tokens do not follow the grammar");
        }
      }
    } else {
      grammar_error = c.status();
    }
  }
  s->req = std::move(r);
  s->callback = std::move(callback);
  Sequence* added = s.get();
  live_[s->req.id] = added;
  scheduler_.add(std::move(s));
  if (!grammar_error.ok()) finish(added, FinishReason::kError, {}, grammar_error);
}

void EngineCore::cancel(const std::string& id) {
  auto it = live_.find(id);
  if (it != live_.end()) finish(it->second, FinishReason::kCancelled, {}, Status::Ok());
}

Status EngineCore::step() {
  StepPlan plan = schedule();
  if (!plan.empty()) return run(plan);
  // Nothing to run while KV is loading from the lower tier: wait for it rather than spin.
  if (!scheduler_.has_work() && !scheduler_.loading().empty()) cache_.wait_for_load();
  return Status::Ok();
}

Status EngineCore::run(const StepPlan& plan) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool pure_decode = std::all_of(plan.seqs.begin(), plan.seqs.end(), [](const PlannedSeq& p) {
    return p.seq->state() == SeqState::kDecode;
  });
  result_.seqs.assign(plan.seqs.size(), SeqResult{});
  Status st;
  {
    TraceSpan span(tracer_, "step", stats_.steps);
    st = runner_.run(plan, &result_);
  }
  if (!st.ok()) {
    for (const PlannedSeq& p : plan.seqs) finish(p.seq, FinishReason::kError, {}, st);
    return st;
  }
  sample(plan, result_);
  const bool mtp = spec_.num_draft_tokens > 0;
  scheduler_.commit(plan, result_, /*register_blocks=*/!mtp);
  if (mtp) {
    const int64_t verified_k = k_proposed_;
    st = propose(plan, result_);
    if (!st.ok()) {
      for (const PlannedSeq& p : plan.seqs) finish(p.seq, FinishReason::kError, {}, st);
      return st;
    }
    scheduler_.register_final_blocks(plan);
    if (pure_decode && !plan.seqs.empty()) {  // the load policy's measurement of this step
      int64_t tokens = 0;
      for (const SeqResult& s : result_.seqs) tokens += int64_t(s.tokens.size());
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      policy_.record(int64_t(plan.seqs.size()), verified_k, k_proposed_, dt.count(), tokens);
    }
  }
  emit(plan, result_);
  ++stats_.steps;
  return Status::Ok();
}

namespace {

// A constrained output's last tokens close what is open (TokenConstraint::narrow_to_end): the
// last min(kGrammarEndTokens, max_tokens / 2) of the budget.
constexpr int64_t kGrammarEndTokens = 48;

// verify_drafts under a grammar: row j is masked to what the constraint allows after the tokens
// emitted before it (disallowed logits become -inf, in `masked`; narrowed to a closing token
// once `left` - j tokens of the budget remain within the end guard, which sets `closing`), then
// sampled exactly as verify_drafts samples it, and the token moves the constraint on.
Status verify_constrained(const float* rows, int64_t n, std::span<const int32_t> drafts,
                          const SamplingParams& params, const TokenHistory& history,
                          std::mt19937_64& rng, TokenConstraint& c, int64_t left, int64_t guard,
                          bool& closing, std::vector<uint32_t>& mask, std::vector<float>& masked,
                          std::vector<int32_t>& out) {
  mask.resize(size_t((n + 31) / 32));
  std::optional<LogitAdjuster> adjust;  // (as verify_drafts: the logits adjusted first)
  if (params.adjusts_logits()) adjust.emplace(params, history);
  for (size_t j = 0; j <= drafts.size(); ++j) {
    const float* row = rows + int64_t(j) * n;
    if (adjust) {
      masked.assign(row, row + n);
      adjust->apply(masked.data(), n);
      row = masked.data();
    }
    std::fill(mask.begin(), mask.end(), ~0u);
    bool apply = c.fill_mask(mask);
    if (apply && left - int64_t(j) <= guard && c.narrow_to_end(mask)) closing = true;
    if (apply) {
      if (!adjust) masked.assign(row, row + n);
      int64_t allowed = 0;
      for (int64_t w = 0; w < int64_t(mask.size()); ++w) {
        const uint32_t bits = mask[size_t(w)];
        allowed += std::popcount(bits);
        if (bits == ~0u) continue;
        for (int64_t t = w * 32; t < std::min(n, w * 32 + 32); ++t) {
          if (!((bits >> (t - w * 32)) & 1u)) masked[size_t(t)] = -INFINITY;
        }
      }
      if (allowed == 0) return Internal("the grammar allows no next token");
      row = masked.data();
    }
    const int32_t t = sample_token(row, n, params, rng);
    if (!c.accept(t))
      return Internal(fmt::format("the grammar refused token {} that it allowed", t));
    out.push_back(t);
    if (adjust) adjust->add(t);
    if (j == drafts.size() || t != drafts[j]) break;
  }
  return Status::Ok();
}

}  // namespace

// Sampling (and log-softmax over the vocabulary for requests that want logprobs), the
// sequences in parallel: each uses only its own rows and sampler state, so the results do not
// depend on the split. A sequence with drafts verifies them (verify_drafts: exact for greedy
// and sampled requests alike) and keeps the accepted ones.
void EngineCore::sample(const StepPlan& plan, StepResult& r) {
  std::vector<size_t> sampled;  // plan indices with logits rows
  std::vector<int64_t> first_row(plan.seqs.size(), 0);
  int64_t rows_so_far = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const PlannedSeq& p = plan.seqs[i];
    CHECK(p.n_logits == (p.n_tokens == p.seq->n_uncomputed() ? 1 : 0) + int64_t(p.drafts.size()),
          "a plan asks for logits of its last token and of every draft");
    first_row[i] = rows_so_far;
    rows_so_far += p.n_logits;
    if (p.n_logits > 0) sampled.push_back(i);
  }
  const int64_t V = model_.config().vocab_size;
  auto seqs = [&](int64_t i0, int64_t i1) {
    std::vector<float> lp;  // [V], sized on first use
    std::vector<uint32_t> mask;
    std::vector<float> masked;
    for (int64_t i = i0; i < i1; ++i) {
      const size_t at = sampled[size_t(i)];
      const PlannedSeq& p = plan.seqs[at];
      Sequence& s = *p.seq;
      const float* rows = &r.logits[size_t(first_row[at] * V)];
      SeqResult& out = r.seqs[at];
      std::vector<int32_t> ids;
      // What the penalties look at: the prompt and the tokens generated so far.
      const std::span<const int32_t> all(s.tokens);
      const TokenHistory history{all.first(size_t(s.n_prompt)), all.subspan(size_t(s.n_prompt))};
      if (s.constraint) {
        const auto g0 = std::chrono::steady_clock::now();
        const int64_t guard = std::min(kGrammarEndTokens, s.req.max_tokens / 2);
        out.error = verify_constrained(rows, V, p.drafts, s.req.sampling, history, s.rng,
                                       *s.constraint, s.req.max_tokens - s.n_generated(), guard,
                                       s.grammar_closing, mask, masked, ids);
        out.grammar_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - g0)
                             .count();
        if (ids.empty()) ids.push_back(argmax(rows, V));  // (only with out.error: it ends)
      } else {
        ids = verify_drafts(rows, V, p.drafts, s.req.sampling, s.rng, history);
      }
      out.n_accepted_drafts = int64_t(ids.size()) - 1;
      for (size_t j = 0; j < ids.size(); ++j) {
        GeneratedToken g{ids[j], 0.0f, {}};
        if (s.req.logprobs) {
          lp.resize(static_cast<size_t>(V));
          log_softmax(rows + int64_t(j) * V, V, lp.data());
          g.logprob = lp[size_t(g.id)];
          if (s.req.top_logprobs > 0) g.top = top_logprobs(lp.data(), V, s.req.top_logprobs);
        }
        out.tokens.push_back(std::move(g));
      }
    }
  };
  pool_ ? pool_->parallel_for(int64_t(sampled.size()), seqs) : seqs(0, int64_t(sampled.size()));
  for (size_t i = 0; i < plan.seqs.size(); ++i) {  // grammar and speculative statistics
    const PlannedSeq& p = plan.seqs[i];
    if (p.seq->constraint && p.n_logits > 0) {
      stats_.grammar_tokens += int64_t(r.seqs[i].tokens.size());
      stats_.grammar_ns += r.seqs[i].grammar_ns;
    }
    if (p.drafts.empty()) continue;
    const int64_t a = r.seqs[i].n_accepted_drafts;
    for (int64_t k = 0; k < int64_t(p.drafts.size()); ++k) {
      ++stats_.spec_verified[size_t(k)];
      stats_.spec_accepted[size_t(k)] += k < a;
    }
    ++stats_.spec_verify_steps;
    stats_.spec_verify_tokens += a + 1;
    p.seq->n_drafts_verified += int64_t(p.drafts.size());
    p.seq->n_drafts_accepted += a;
  }
}

int64_t EngineCore::drafts_per_sequence() {
  int64_t decoding = 0;
  for (const auto& s : scheduler_.running()) decoding += s->state() == SeqState::kDecode;
  if (spec_.max_rows < 0) return policy_.choose(decoding);  // measured
  int64_t k = spec_.num_draft_tokens;
  while (spec_.max_rows > 0 && k > 0 && decoding * (1 + k) > spec_.max_rows) --k;
  return k;
}

Status EngineCore::propose(const StepPlan& plan, const StepResult& r) {
  const int64_t H = model_.hidden_width(), V = model_.config().vocab_size;
  const int64_t k_policy = drafts_per_sequence();
  k_proposed_ = k_policy;
  // Pass 1, every planned sequence (under EP, on every rank, with or without rows): its
  // positions made final this step, [n_computed - n_final,
  // n_computed). The row at p carries t_{p+1} and the main model's hidden row at p; the last
  // row's logits propose the first draft (the token after tokens.back()).
  struct Want {
    Sequence* seq;
    int64_t k;           // drafts to propose (0: only the pass that keeps the cache in step)
    int64_t hidden_row;  // of r.hidden: the sequence's first row this step
    int64_t n_final;
  };
  std::vector<Want> wants;
  int64_t hidden_row = 0;
  bool any_decode = false;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const PlannedSeq& p = plan.seqs[i];
    Sequence& s = *p.seq;
    const int64_t n_final = p.n_tokens + r.seqs[i].n_accepted_drafts;
    s.drafts.clear();
    int64_t k = 0;
    if (s.state() == SeqState::kDecode) {
      any_decode = true;
      // (no more drafts than the tokens it may still generate after the next one)
      k = std::min(k_policy, s.req.max_tokens - s.n_generated() - 1);
      if (k > 0) k = scheduler_.reserve_drafts(s, k);
    }
    wants.push_back({&s, std::max<int64_t>(k, 0), hidden_row, n_final});
    hidden_row += p.n_rows();
  }
  if (any_decode && k_policy < spec_.num_draft_tokens) ++stats_.spec_off_steps;

  std::vector<StepSequence> batch;
  std::vector<float> hidden;  // [rows, H] in batch order
  for (const Want& w : wants) {
    const Sequence& s = *w.seq;
    const int64_t start = s.n_computed - w.n_final;
    batch.push_back(
        {std::span<const int32_t>(s.tokens).subspan(size_t(start + 1), size_t(w.n_final)), start,
         s.block_table, w.k > 0 ? 1 : 0, 0});
    hidden.insert(hidden.end(), r.hidden.begin() + w.hidden_row * H,
                  r.hidden.begin() + (w.hidden_row + w.n_final) * H);
  }
  RETURN_IF_ERROR(model_.forward_mtp(batch, hidden.data(), cache_, &mtp_out_));

  // Then chained passes, one row per sequence still wanting drafts: the row at position
  // n_computed + j - 1 carries the j-th draft and the module's own output row before it. Rows
  // of mtp_out_ (hidden and logits alike) are the drafting sequences', in `chain` order.
  std::vector<Want*> chain;
  for (Want& w : wants) {
    if (w.k > 0) chain.push_back(&w);
  }
  for (size_t c = 0; c < chain.size(); ++c) {
    chain[c]->seq->drafts = {argmax(&mtp_out_.logits[c * size_t(V)], V)};
  }
  // Under EP every rank makes the same number of passes (each is collective), K - 1, with no
  // rows where it has nothing to chain.
  std::vector<int32_t> chain_tokens;
  for (int64_t j = 1; !model_.collective() || j < spec_.num_draft_tokens; ++j) {
    std::vector<Want*> next;
    hidden.clear();
    for (size_t c = 0; c < chain.size(); ++c) {
      if (int64_t(chain[c]->seq->drafts.size()) >= chain[c]->k) continue;
      next.push_back(chain[c]);
      hidden.insert(hidden.end(), mtp_out_.hidden.begin() + int64_t(c) * H,
                    mtp_out_.hidden.begin() + int64_t(c + 1) * H);
    }
    if (next.empty() && !model_.collective()) break;
    chain_tokens.resize(next.size());
    batch.clear();
    for (size_t c = 0; c < next.size(); ++c) {
      const Sequence& s = *next[c]->seq;
      chain_tokens[c] = s.drafts.back();
      batch.push_back({std::span<const int32_t>(&chain_tokens[c], 1), s.n_computed + j - 1,
                       s.block_table, 1, 0});
    }
    RETURN_IF_ERROR(model_.forward_mtp(batch, hidden.data(), cache_, &mtp_out_));
    for (size_t c = 0; c < next.size(); ++c) {
      next[c]->seq->drafts.push_back(argmax(&mtp_out_.logits[c * size_t(V)], V));
    }
    chain = std::move(next);
  }
  return Status::Ok();
}

void EngineCore::emit(const StepPlan& plan, StepResult& r) {
  const std::optional<int64_t> eos = model_.config().eos_token_id;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    Sequence& s = *plan.seqs[i].seq;
    RequestOutput out;
    if (!r.seqs[i].error.ok()) {
      finish(&s, FinishReason::kError, {}, r.seqs[i].error);
      continue;
    }
    bool finished = false;  // (finish() destroys s)
    for (size_t k = 0; !finished && k < r.seqs[i].tokens.size(); ++k) {
      GeneratedToken& g = r.seqs[i].tokens[k];
      const int32_t tok = g.id;
      const int64_t n_generated = s.n_generated() - int64_t(r.seqs[i].tokens.size() - 1 - k);
      out.tokens.push_back(std::move(g));
      ++stats_.generated_tokens;
      const std::vector<int32_t>& stops = s.req.stop_token_ids;
      if ((!s.req.ignore_eos && eos && tok == *eos) ||
          std::find(stops.begin(), stops.end(), tok) != stops.end()) {
        // A grammar closed at the end of the budget: the output is whole but cut short.
        const FinishReason why = s.grammar_closing ? FinishReason::kLength : FinishReason::kStop;
        finish(&s, why, std::move(out.tokens), Status::Ok());
        finished = true;
      } else if (n_generated >= s.req.max_tokens) {
        finish(&s, FinishReason::kLength, std::move(out.tokens), Status::Ok());
        finished = true;
      }
    }
    if (finished || out.tokens.empty()) continue;
    if (s.req.hand_off && s.state() == SeqState::kDecode) {
      hand_off(&s, std::move(out.tokens));
      continue;
    }
    out.prompt_tokens = s.n_prompt;
    out.cached_prompt_tokens = s.n_cached_prompt;
    out.draft_tokens = s.n_drafts_verified;
    out.accepted_draft_tokens = s.n_drafts_accepted;
    s.callback(out);
  }
}

// The KV of the computed tokens (the last token sampled has none yet), the tokens and the
// sampler go to RequestOutput::handoff; the blocks are released here (full ones stay cached).
void EngineCore::hand_off(Sequence* s, std::vector<GeneratedToken> last) {
  auto h = std::make_shared<KvHandoff>();
  h->fingerprint = cache_.fingerprint();
  h->block_bytes = cache_.layout().block_bytes();
  h->tokens = s->tokens;
  h->n_prompt = s->n_prompt;
  h->n_computed = s->n_computed;
  h->n_cached_prompt = s->n_cached_prompt;
  // Blocks behind every window go without their window regions (KvHandoff::blocks).
  const int32_t trim = cache_.window_trim_point(s->n_computed);
  for (int32_t b = 0; b < blocks_for(s->n_computed); ++b) {
    const std::vector<uint8_t> bytes = cache_.export_block(s->block_table[size_t(b)]).bytes;
    const size_t size = b < trim ? cache_.layout().main_bytes() : bytes.size();
    h->blocks.emplace_back(bytes.begin(), bytes.begin() + std::ptrdiff_t(size));
  }
  std::ostringstream rng;
  rng << s->rng;
  h->rng_state = rng.str();
  s->set_state(SeqState::kHandedOff);
  finish(s, FinishReason::kHandedOff, std::move(last), Status::Ok(), std::move(h));
}

void EngineCore::finish(Sequence* s, FinishReason reason, std::vector<GeneratedToken> last,
                        Status error, std::shared_ptr<const KvHandoff> handoff) {
  RequestOutput out;
  out.handoff = std::move(handoff);
  out.tokens = std::move(last);
  out.finished = true;
  out.finish_reason = reason;
  out.error = std::move(error);
  out.prompt_tokens = s->n_prompt;
  out.cached_prompt_tokens = s->n_cached_prompt;
  out.draft_tokens = s->n_drafts_verified;
  out.accepted_draft_tokens = s->n_drafts_accepted;
  live_.erase(s->req.id);
  std::unique_ptr<Sequence> owned = scheduler_.remove(s);
  if (reason != FinishReason::kError) stats_.prompt_tokens += s->n_prompt;
  owned->callback(out);
}

void EngineCore::finish_all(FinishReason reason, const Status& error) {
  while (!live_.empty()) finish(live_.begin()->second, reason, {}, error);
}

}  // namespace moeserve
