// StopMatcher: finds the first occurrence of any stop string in text that arrives in pieces
// (detokenized tokens), including matches that straddle pieces. Text that could still be the
// start of a stop string is held back until the next piece decides; the stop string itself and
// everything after it are never released.
//
// Stop strings must be non-empty and valid UTF-8 (the API boundary checks it); pieces are whole
// UTF-8 characters (IncrementalDetokenizer's contract), so held-back text starts at a character
// boundary and released text is always whole characters. One instance per choice; not
// thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moeserve {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Step {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string ended the text (it is not in `text`)
  };
  // Adds a piece. After a stop, further pieces are ignored (empty steps).
  Step push(std::string_view piece);
  // End of the stream: releases what is held back (nothing after a stop).
  std::string finish();

  bool stopped() const { return stopped_; }
  // The stop string that ended the text (empty before a stop).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace moeserve
