// IncrementalDetokenizer: turns a stream of token ids into text pieces for streaming output.
//
// Contract: a piece never contains a broken UTF-8 sequence (bytes of a character split across
// tokens are held back until the character is complete), and the concatenation of every push()
// result followed by finish() equals Tokenizer::decode() of all the ids with the same
// skip_special. One instance per sequence; not thread-safe (the Tokenizer it holds is).
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace moeserve {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special)
      : tok_(std::move(tokenizer)), skip_special_(skip_special) {}

  // Adds one token; returns the text that is now final (often the token's text, sometimes
  // empty while a multi-byte character is incomplete).
  std::string push(int32_t id);
  // Ends the stream: returns what is held back (a truncated character becomes U+FFFD, as in
  // decode()) and resets to the empty state.
  std::string finish();

  // Bytes held back, waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace moeserve
