#include "engine/sequence.h"

#include <fmt/format.h>

#include "core/check.h"

namespace moeserve {

std::string_view to_string(SeqState s) {
  switch (s) {
    case SeqState::kWaiting:
      return "waiting";
    case SeqState::kLoadingKv:
      return "loading KV";
    case SeqState::kPrefill:
      return "prefill";
    case SeqState::kDecode:
      return "decode";
    case SeqState::kHandedOff:
      return "handed off";
    case SeqState::kFinished:
      return "finished";
  }
  return "?";
}

// The one table of transitions (docs/engine.md draws it).
bool is_valid_transition(SeqState from, SeqState to) {
  using S = SeqState;
  switch (from) {
    case S::kWaiting:
      return to == S::kLoadingKv || to == S::kPrefill || to == S::kFinished;
    case S::kLoadingKv:
      return to == S::kPrefill || to == S::kWaiting || to == S::kFinished;
    case S::kPrefill:
      return to == S::kDecode || to == S::kWaiting || to == S::kHandedOff || to == S::kFinished;
    case S::kDecode:
      return to == S::kWaiting || to == S::kHandedOff || to == S::kFinished;
    case S::kHandedOff:
      return to == S::kFinished;
    case S::kFinished:
      return false;
  }
  return false;
}

void Sequence::set_state(SeqState to) {
  CHECK(is_valid_transition(state_, to), fmt::format("sequence '{}': {} -> {} is not a transition",
                                                     req.id, to_string(state_), to_string(to))
                                             .c_str());
  state_ = to;
}

}  // namespace moeserve
