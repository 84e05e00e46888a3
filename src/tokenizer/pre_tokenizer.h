// PreTokenizer: splits text into the "words" that BPE encodes one by one, as Hugging Face's
// pre_tokenizers do: a sequence of Split steps (regex + delimiter behavior), each applied to
// every piece the previous step produced (so lookarounds never see past a piece), followed by
// the ByteLevel step (which, with use_regex, splits once more with the GPT-2 pattern; the
// byte-to-alphabet mapping itself is implicit because our BPE works on raw bytes).
//
// Immutable after construction; split() is thread-safe (scratch state lives in the caller's
// Scratch).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/regex.h"

namespace moeserve {

// Hugging Face's SplitDelimiterBehavior.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  size_t begin;
  size_t end;
};

class PreTokenizer {
 public:
  struct Step {
    Regex regex;
    SplitBehavior behavior;
    bool invert;
  };

  // Per-call scratch buffers (reuse across calls on one thread to avoid allocation).
  class Scratch {
   public:
    explicit Scratch(const PreTokenizer& pt);

   private:
    friend class PreTokenizer;
    std::vector<std::unique_ptr<Regex::MatchData>> md_;
    std::vector<Span> matches_, a_, b_;
  };

  void add_step(Step step) { steps_.push_back(std::move(step)); }

  // The words of text[0, size) as spans of text, in order, non-empty. With no steps the whole
  // text is one word. Replaces the contents of `words`.
  void split(std::string_view text, Scratch& scratch, std::vector<Span>& words) const;

 private:
  void apply(const Step& step, Regex::MatchData& md, std::string_view text, Span piece,
             std::vector<Span>& matches, std::vector<Span>& out) const;

  std::vector<Step> steps_;
};

// The pattern the ByteLevel pre-tokenizer applies when use_regex is true (GPT-2's).
inline constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace moeserve
