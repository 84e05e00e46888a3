// Regex: a compiled PCRE2 pattern (UTF + UCP, JIT-compiled when the platform allows) for the
// pre-tokenizer's Split rules, which Hugging Face writes in Oniguruma syntax; the patterns used by
// byte-level BPE tokenizers (\p{L}, \p{N}, \s, lookahead, classes) are translated where the two
// engines differ (Oniguruma's \s; newer Unicode tables: see regex.cpp, unicode_delta.h).
//
// A Regex is immutable after compile() and may be shared by threads; each thread (each call)
// brings its own MatchData. Subjects must be valid UTF-8 (the caller validates once).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace moeserve {

class Regex {
 public:
  // Scratch space for one match at a time; not shareable between threads.
  class MatchData {
   public:
    explicit MatchData(const Regex& re);
    ~MatchData();
    MatchData(const MatchData&) = delete;
    MatchData& operator=(const MatchData&) = delete;

   private:
    friend class Regex;
    void* md_;  // pcre2_match_data_8*
  };

  // `pattern` is in the Oniguruma dialect of tokenizer.json (see regex.cpp for the one
  // difference that needs translating: \s).
  static Result<Regex> compile(const std::string& pattern);

  // First match in subject starting at or after `offset` (lookbehind/lookahead see only
  // `subject`). Returns false when there is none.
  bool find(std::string_view subject, size_t offset, MatchData& md, size_t* begin,
            size_t* end) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
};

}  // namespace moeserve
