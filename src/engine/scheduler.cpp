#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace moeserve {

namespace {

// Plans n tokens of s, then `drafts`: logits for the last position when they reach the end
// of its tokens, and for every draft.
void add_to_plan(StepPlan& plan, Sequence* s, int64_t n, std::vector<int32_t> drafts = {}) {
  const int64_t n_logits = s->n_computed + n == int64_t(s->tokens.size()) ? 1 : 0;
  const int64_t n_drafts = int64_t(drafts.size());
  plan.seqs.push_back({s, n, std::move(drafts), n_logits + n_drafts});
}

}  // namespace

bool Scheduler::ensure_blocks(Sequence& s, int64_t n_tokens) {
  int32_t need = blocks_for(s.n_computed + n_tokens) - int32_t(s.block_table.size());
  return need <= 0 || cache_.allocate(need, &s.block_table, &s.window_holds);
}

void Scheduler::trim_windows(Sequence& s) {
  cache_.release_windows(s.block_table, &s.window_holds, cache_.window_trim_point(s.n_computed));
}

void Scheduler::drop_blocks(Sequence& s) {
  if (s.load) {  // the tier may still be writing into them
    cache_.release_after_load(std::move(s.load), std::move(s.block_table),
                              std::move(s.window_holds));
    s.load.reset();
  } else {
    cache_.release(s.block_table, s.window_holds);
  }
  s.block_table.clear();
  s.window_holds.clear();
  s.block_hashes.clear();
  s.n_computed = 0;
}

void Scheduler::preempt(Sequence* victim) {
  drop_blocks(*victim);
  victim->drafts.clear();  // (proposed for positions it no longer has)
  victim->set_state(SeqState::kWaiting);
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const auto& p) { return p.get() == victim; });
  waiting_.push_front(std::move(*it));
  running_.erase(it);
  ++preemptions_;
}

int64_t Scheduler::chunk(const Sequence& s, int64_t budget) const {
  int64_t n = std::min(s.n_uncomputed(), budget);
  if (cache_.windowed() && cache_.window_pages() < cache_.num_blocks()) {
    // A chunk whose blocks' window pages the pool holds beside the window_blocks() before it
    // (and one a chunk may straddle into): what one sequence alone always gets.
    n = std::min(n, int64_t(cache_.window_pages() - cache_.window_blocks() - 1) * kKvBlockSize);
  }
  return config_.max_chunk_tokens > 0 ? std::min(n, config_.max_chunk_tokens) : n;
}

bool Scheduler::has_work() const {
  return !running_.empty() || !waiting_.empty() || has_finished_load();
}

bool Scheduler::has_finished_load() const {
  return std::any_of(loading_.begin(), loading_.end(),
                     [](const auto& s) { return s->load->finished(); });
}

void Scheduler::count_admission(Sequence& s, int64_t lower_tokens) {
  if (s.admitted_before) return;
  prefix_queries_ += s.n_prompt;
  s.n_cached_prompt = std::min(s.n_computed, s.n_prompt);
  prefix_hits_ += s.n_cached_prompt;
  prefix_hits_lower_ += std::min(lower_tokens, s.n_cached_prompt);
  s.admitted_before = true;
}

// A resumed request's KV (docs/pd.md): the full blocks RAM already holds are shared, the rest
// copied into fresh blocks, and the full ones registered under this cache's own chain hashes
// (the sender's are not trusted). False, nothing taken, when the blocks are not available.
bool Scheduler::import_kv(Sequence& s) {
  const KvHandoff& h = *s.import;
  const int32_t n = int32_t(h.blocks.size());
  const int32_t hit = cache_.acquire_prefix(s.tokens, int32_t(h.n_computed / kKvBlockSize),
                                            &s.block_table, &s.block_hashes, &s.window_holds);
  // (Blocks behind every window come without their window regions.)
  const int32_t trim = cache_.window_trim_point(h.n_computed);
  const int32_t windows = cache_.windowed() ? n - std::max(hit, trim) : 0;
  if (cache_.num_available() < n - hit || cache_.num_windows_available() < windows) {
    drop_blocks(s);
    return false;
  }
  for (int32_t b = hit; b < n; ++b) {
    CHECK(cache_.import_bytes(h.blocks[size_t(b)], &s.block_table, &s.window_holds, b >= trim),
          "blocks counted as available");
  }
  s.n_computed = h.n_computed;
  register_final_blocks(s);
  return true;
}

// Sequences whose load finished: the loaded blocks are theirs (registered), the rest of the
// reserved blocks are fresh ones for the prefill; they run from the next plan on.
void Scheduler::take_loaded() {
  for (auto it = loading_.begin(); it != loading_.end();) {
    Sequence& s = **it;
    if (!s.load->finished()) {
      ++it;
      continue;
    }
    auto reserved =
        std::span<const int32_t>(s.block_table).subspan(size_t(s.n_computed / kKvBlockSize));
    const int32_t n_loaded = cache_.finish_load(*s.load, reserved, &s.block_hashes);
    const int64_t loaded = int64_t(n_loaded) * kKvBlockSize;
    s.load.reset();
    if (cache_.windowed()) {
      // The rest of the reserved blocks go (most have no window pages); chunks take fresh ones.
      const size_t keep = size_t(s.n_computed / kKvBlockSize + n_loaded);
      std::vector<int32_t> holds,
          rest(s.block_table.begin() + std::ptrdiff_t(keep), s.block_table.end());
      std::erase_if(s.window_holds, [&](int32_t idx) {
        if (size_t(idx) < keep) return false;
        holds.push_back(idx - int32_t(keep));
        return true;
      });
      cache_.release(rest, holds);
      s.block_table.resize(keep);
    }
    s.n_computed += loaded;
    count_admission(s, loaded);
    s.set_state(SeqState::kPrefill);
    running_.push_back(std::move(*it));
    it = loading_.erase(it);
  }
}

void Scheduler::plan_running(SeqState pass, StepPlan& plan, int64_t& budget) {
  auto planned = [&](const Sequence* s) {
    return std::any_of(plan.seqs.begin(), plan.seqs.end(),
                       [&](const PlannedSeq& p) { return p.seq == s; });
  };
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i].get();
    if (s->state() != pass || planned(s)) continue;
    int64_t n = chunk(*s, budget);
    // A decode's drafts (docs/mtp.md), as many as the budget leaves room for; none when their
    // blocks would take a preemption (reserve_drafts() normally got them already).
    std::vector<int32_t> drafts;
    if (pass == SeqState::kDecode && n == s->n_uncomputed() && !s->drafts.empty()) {
      const int64_t d = std::min(int64_t(s->drafts.size()), budget - n);
      if (d > 0 && ensure_blocks(*s, n + d))
        drafts.assign(s->drafts.begin(), s->drafts.begin() + d);
    }
    s->drafts.clear();
    while (!ensure_blocks(*s, n)) {
      // Out of blocks: preempt the most recently admitted sequence not in this step.
      Sequence* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend() && !victim; ++it) {
        if (!planned(it->get())) victim = it->get();
      }
      preempt(victim);  // s itself is unplanned, so a victim always exists
      if (victim == s) return;
    }
    budget -= n + int64_t(drafts.size());
    add_to_plan(plan, s, n, std::move(drafts));
  }
}

int64_t Scheduler::reserve_drafts(Sequence& s, int64_t k) {
  for (; k > 0; --k) {
    if (ensure_blocks(s, s.n_uncomputed() + k)) return k;
  }
  return 0;
}

// Admits waiting requests, oldest first: RAM prefix hits are taken at once; when the lower
// tier holds the next full block the sequence goes to loading KV instead of running. A request
// whose next block another sequence is loading now stays queued (others pass it) until that
// load lands in RAM: N requests sharing a prompt after a restart read it from disk once.
void Scheduler::admit(StepPlan& plan, int64_t& budget) {
  size_t i = 0;
  while (i < waiting_.size() && budget > 0 &&
         int64_t(running_.size() + loading_.size()) < config_.max_num_seqs) {
    Sequence* s = waiting_[i].get();
    if (s->import) {
      if (!import_kv(*s)) break;
      int64_t n = chunk(*s, budget);
      if (!ensure_blocks(*s, n)) {
        drop_blocks(*s);
        break;
      }
      s->import.reset();
      s->set_state(SeqState::kPrefill);
      running_.push_back(std::move(waiting_[i]));
      waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
      add_to_plan(plan, s, n);
      budget -= n;
      continue;
    }
    // Cached full blocks of the prefix, always leaving at least one token to compute (its
    // logits are needed).
    int32_t max_blocks = int32_t((int64_t(s->tokens.size()) - 1) / kKvBlockSize);
    int32_t hit = cache_.acquire_prefix(s->tokens, max_blocks, &s->block_table, &s->block_hashes,
                                        &s->window_holds);
    s->n_computed = int64_t(hit) * kKvBlockSize;
    if (hit < max_blocks) {
      const uint64_t parent = hit > 0 ? s->block_hashes.back() : cache_.fingerprint();
      auto loading_next = [&] {  // (the next block's hash only when something is loading)
        const uint64_t next =
            cache_.chain_hash(parent, std::span<const int32_t>(s->tokens).subspan(
                                          size_t(hit) * kKvBlockSize, size_t(kKvBlockSize)));
        return std::any_of(loading_.begin(), loading_.end(),
                           [&](const auto& l) { return l->load->hashes[0] == next; });
      };
      if (!loading_.empty() && loading_next()) {
        drop_blocks(*s);
        ++i;
        continue;
      }
      s->load =
          cache_.start_load(s->tokens, hit, max_blocks, parent, &s->block_table, &s->window_holds);
      if (s->load) {
        s->set_state(SeqState::kLoadingKv);
        loading_.push_back(std::move(waiting_[i]));
        waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
        continue;
      }
    }
    int64_t n = chunk(*s, budget);
    if (!ensure_blocks(*s, n)) {
      drop_blocks(*s);
      break;
    }
    count_admission(*s, 0);
    s->set_state(SeqState::kPrefill);
    running_.push_back(std::move(waiting_[i]));
    waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
    add_to_plan(plan, s, n);
    budget -= n;
  }
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int64_t budget = config_.max_batch_tokens;
  take_loaded();
  // Decodes first (one token each), then running sequences still prefilling, then admissions.
  plan_running(SeqState::kDecode, plan, budget);
  plan_running(SeqState::kPrefill, plan, budget);
  admit(plan, budget);
  if (config_.await_loads && !loading_.empty()) {
    while (!loading_.empty()) {
      cache_.wait_for_load();
      take_loaded();
    }
    plan_running(SeqState::kPrefill, plan, budget);
  }
  return plan;
}

void Scheduler::commit(const StepPlan& plan, const StepResult& result, bool register_blocks) {
  CHECK(result.seqs.size() == plan.seqs.size(), "a step result for another plan");
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const PlannedSeq& p = plan.seqs[i];
    const SeqResult& r = result.seqs[i];
    Sequence& s = *p.seq;
    CHECK(r.n_accepted_drafts <= int64_t(p.drafts.size()), "more drafts accepted than planned");
    CHECK(r.n_accepted_drafts == 0 || r.tokens.size() == size_t(r.n_accepted_drafts) + 1,
          "accepted drafts come with their tokens and the bonus token");
    s.n_computed += p.n_tokens + r.n_accepted_drafts;
    for (const GeneratedToken& t : r.tokens) s.tokens.push_back(t.id);
    if (register_blocks) register_final_blocks(s);
    if (s.state() == SeqState::kPrefill && !r.tokens.empty()) s.set_state(SeqState::kDecode);
  }
}

void Scheduler::register_final_blocks(const StepPlan& plan) {
  for (const PlannedSeq& p : plan.seqs) register_final_blocks(*p.seq);
}

// Blocks whose 64 tokens all have final KV join the prefix index, in chain order.
void Scheduler::register_final_blocks(Sequence& s) {
  for (int64_t b = int64_t(s.block_hashes.size()); (b + 1) * kKvBlockSize <= s.n_computed; ++b) {
    auto block_tokens =
        std::span<const int32_t>(s.tokens).subspan(size_t(b * kKvBlockSize), size_t(kKvBlockSize));
    const uint64_t parent = b == 0 ? cache_.fingerprint() : s.block_hashes[size_t(b - 1)];
    const uint64_t h = cache_.chain_hash(parent, block_tokens);
    cache_.register_block(s.block_table[size_t(b)], h, parent, block_tokens);
    s.block_hashes.push_back(h);
  }
  // (Registered first: a block behind every window keeps its page as a cached one.)
  trim_windows(s);
}

std::unique_ptr<Sequence> Scheduler::remove(Sequence* seq) {
  for (auto* q : {&running_, &waiting_, &loading_}) {
    auto it = std::find_if(q->begin(), q->end(), [&](const auto& p) { return p.get() == seq; });
    if (it == q->end()) continue;
    std::unique_ptr<Sequence> out = std::move(*it);
    q->erase(it);
    drop_blocks(*out);
    out->set_state(SeqState::kFinished);
    return out;
  }
  return nullptr;
}

}  // namespace moeserve
