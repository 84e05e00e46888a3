// Sequence: the engine's state for one request (tokens, KV block table, sampling state) and
// the state machine it moves through (docs/engine.md "Sequence states"). Owned by the
// scheduler; touched only by the engine's step thread.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string_view>
#include <vector>

#include "cache/kv_cache.h"
#include "engine/engine.h"

namespace moeserve {

// waiting --admit--> prefill --first token--> decode --stop/length/cancel/error--> finished
//    ^                  |                        |
//    +----preempt-------+------------------------+
// Also: every state may finish (cancel, error, or the end of its run); loading KV (a lower tier's
// blocks on their way in) sits between waiting and prefill and may fall back to waiting; prefill
// and decode may be handed off (the KV went to another unit, which continues the request), and a
// handed-off sequence only finishes. is_valid_transition() is the one table (docs/engine.md
// draws it); every transition goes through Sequence::set_state, which CHECKs it.
enum class SeqState { kWaiting, kLoadingKv, kPrefill, kDecode, kHandedOff, kFinished };

std::string_view to_string(SeqState s);
// Whether `from -> to` is an edge of the diagram above.
bool is_valid_transition(SeqState from, SeqState to);

struct Sequence {
  EngineRequest req;
  OutputCallback callback;
  std::vector<int32_t> tokens;  // prompt, then generated tokens (all final: drafts live in plans)
  int64_t n_prompt = 0;
  std::vector<int32_t> block_table;
  std::vector<uint64_t> block_hashes;  // chain hashes of the leading full, final blocks
  // Indices into block_table of the blocks whose window pages it holds (a layout with sliding
  // windows: KvCache, "The window pool").
  std::vector<int32_t> window_holds;
  int64_t n_computed = 0;       // leading tokens whose KV is in the cache
  int64_t n_cached_prompt = 0;  // prompt tokens found in the prefix cache at first admission
  // While loading KV: the tier's job; its destinations are block_table[n_computed / 64 ...].
  std::shared_ptr<KvLoadJob> load;
  bool admitted_before = false;
  // A request resumed from a prefill unit's hand-off (docs/pd.md): its KV, copied into blocks at
  // admission (then dropped: a preempted sequence recomputes like any other).
  std::shared_ptr<const KvHandoff> import;
  std::mt19937_64 rng;
  // The request's grammar state (EngineRequest::grammar), past every token in `tokens`.
  std::unique_ptr<TokenConstraint> constraint;
  bool grammar_closing = false;  // the budget's end made it close (finishes with kLength)
  // MTP speculative decoding (docs/mtp.md): the tokens the module proposed to follow
  // tokens.back(), verified by the next step (not part of tokens until accepted), and this
  // request's counts of drafts verified and accepted.
  std::vector<int32_t> drafts;
  int64_t n_drafts_verified = 0;
  int64_t n_drafts_accepted = 0;

  SeqState state() const { return state_; }
  void set_state(SeqState to);  // CHECKs is_valid_transition(state(), to)

  int64_t n_generated() const { return int64_t(tokens.size()) - n_prompt; }
  int64_t n_uncomputed() const { return int64_t(tokens.size()) - n_computed; }
  bool running() const { return state_ == SeqState::kPrefill || state_ == SeqState::kDecode; }

 private:
  SeqState state_ = SeqState::kWaiting;
};

}  // namespace moeserve
