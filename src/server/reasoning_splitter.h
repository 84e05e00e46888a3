// ReasoningSplitter: separates a DeepSeek-R1 answer's thinking ("<think>...</think>") from its
// content in text that arrives in pieces, for the API's `reasoning_content` field. Tags that
// straddle pieces are handled by holding back a possible partial tag.
//
// If the prompt already opened the block (later R1 templates end the generation prompt with
// "<think>\n"), the output starts as reasoning. Otherwise an output that starts with "<think>"
// opens it, and any other output is all content. Reasoning never closed is all reasoning (a
// truncated answer). The tags themselves are dropped. One instance per choice; not thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace moeserve {

class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool starts_in_reasoning);

  struct Parts {
    std::string reasoning;
    std::string content;
  };
  Parts push(std::string_view piece);
  // End of the stream: releases what is held back.
  Parts finish();
  // Inside the thinking block (its closing tag included, until the tag has been pushed).
  bool in_reasoning() const { return state_ == State::kReasoning; }

 private:
  enum class State { kStart, kReasoning, kContent };
  State state_;
  std::string held_;
};

}  // namespace moeserve
