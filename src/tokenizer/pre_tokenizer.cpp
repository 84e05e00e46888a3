#include "tokenizer/pre_tokenizer.h"

#include "tokenizer/utf8.h"

namespace moeserve {

PreTokenizer::Scratch::Scratch(const PreTokenizer& pt) {
  for (const Step& s : pt.steps_) md_.push_back(std::make_unique<Regex::MatchData>(s.regex));
}

void PreTokenizer::split(std::string_view text, Scratch& scratch, std::vector<Span>& words) const {
  words.clear();
  if (text.empty()) return;
  if (steps_.empty()) {
    words.push_back({0, text.size()});
    return;
  }
  std::vector<Span>* cur = &scratch.a_;
  cur->clear();
  cur->push_back({0, text.size()});
  for (size_t i = 0; i < steps_.size(); ++i) {
    std::vector<Span>* next =
        (i + 1 == steps_.size()) ? &words : (cur == &scratch.a_ ? &scratch.b_ : &scratch.a_);
    next->clear();
    for (const Span& piece : *cur)
      apply(steps_[i], *scratch.md_[i], text, piece, scratch.matches_, *next);
    cur = next;
  }
}

// Splits one piece: finds the matches (as Hugging Face's find_iter: empty matches are skipped),
// labels matches and the gaps between them, then groups them by the delimiter behavior.
void PreTokenizer::apply(const Step& step, Regex::MatchData& md, std::string_view text, Span piece,
                         std::vector<Span>& marks, std::vector<Span>& out) const {
  const std::string_view sub = text.substr(piece.begin, piece.end - piece.begin);
  // Fast path for the common case: Isolated, not inverted -> emit gaps and matches directly.
  const bool simple = step.behavior == SplitBehavior::kIsolated && !step.invert;
  marks.clear();
  size_t pos = 0, prev = 0, b = 0, e = 0;
  std::vector<bool> is_match;  // parallel to `marks` (general path only)
  while (pos <= sub.size() && step.regex.find(sub, pos, md, &b, &e)) {
    if (e == b) {  // empty match: step over one character
      if (b >= sub.size()) break;
      const size_t n = utf8::valid_sequence_length(sub.substr(b));
      pos = b + (n ? n : 1);
      continue;
    }
    if (b > prev) {
      if (simple)
        out.push_back({piece.begin + prev, piece.begin + b});
      else {
        marks.push_back({prev, b});
        is_match.push_back(false);
      }
    }
    if (simple)
      out.push_back({piece.begin + b, piece.begin + e});
    else {
      marks.push_back({b, e});
      is_match.push_back(true);
    }
    prev = pos = e;
  }
  if (prev < sub.size()) {
    if (simple)
      out.push_back({piece.begin + prev, piece.begin + sub.size()});
    else {
      marks.push_back({prev, sub.size()});
      is_match.push_back(false);
    }
  }
  if (simple) return;

  if (step.invert) is_match.flip();
  const size_t first_out = out.size();
  auto push = [&](Span s) { out.push_back({piece.begin + s.begin, piece.begin + s.end}); };
  switch (step.behavior) {
    case SplitBehavior::kRemoved:
      for (size_t i = 0; i < marks.size(); ++i)
        if (!is_match[i]) push(marks[i]);
      break;
    case SplitBehavior::kIsolated:
      for (const Span& s : marks) push(s);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (size_t i = 0; i < marks.size(); ++i) {
        if (is_match[i] && !prev_match && out.size() > first_out)
          out.back().end = piece.begin + marks[i].end;
        else
          push(marks[i]);
        prev_match = is_match[i];
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // Walk backwards: a match joins the piece after it when that piece is not a match.
      std::vector<Span> rev;
      bool prev_match = false;
      for (size_t k = marks.size(); k-- > 0;) {
        if (is_match[k] && !prev_match && !rev.empty())
          rev.back().begin = marks[k].begin;
        else
          rev.push_back(marks[k]);
        prev_match = is_match[k];
      }
      for (size_t k = rev.size(); k-- > 0;) push(rev[k]);
      break;
    }
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (size_t i = 0; i < marks.size(); ++i) {
        if (is_match[i] == prev_match && out.size() > first_out)
          out.back().end = piece.begin + marks[i].end;
        else
          push(marks[i]);
        prev_match = is_match[i];
      }
      break;
    }
  }
}

}  // namespace moeserve
