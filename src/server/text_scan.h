// Scanning generated text for tags that may straddle the pieces it arrives in (the reasoning
// splitter and the tool-call parsers).
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string_view>
#include <utility>

namespace moeserve {

// The earliest of `needles` in `text`: (position, which), or npos. On a tie the first listed
// wins (callers list tags none of which is a prefix of another).
inline std::pair<size_t, size_t> earliest(std::string_view text,
                                          std::initializer_list<std::string_view> needles) {
  std::pair<size_t, size_t> best{std::string_view::npos, 0};
  size_t k = 0;
  for (std::string_view n : needles) {
    const size_t at = text.find(n);
    if (at < best.first) best = {at, k};
    ++k;
  }
  return best;
}

// Length of the longest tail of `text` that is a proper prefix of one of `tags`: what must be
// held back until the next piece decides.
inline size_t partial_tail(std::string_view text, std::initializer_list<std::string_view> tags) {
  size_t best = 0;
  for (std::string_view tag : tags) {
    for (size_t len = std::min(tag.size() - 1, text.size()); len > best; --len) {
      if (text.substr(text.size() - len) == tag.substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

}  // namespace moeserve
