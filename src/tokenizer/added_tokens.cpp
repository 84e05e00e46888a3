#include "tokenizer/added_tokens.h"

#include <algorithm>

namespace moeserve {

AddedTokenMatcher::AddedTokenMatcher() : nodes_(1) {}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t b) const {
  const auto& kids = nodes_[node].kids;
  auto it =
      std::lower_bound(kids.begin(), kids.end(), b,
                       [](const std::pair<uint8_t, int32_t>& k, uint8_t v) { return k.first < v; });
  return (it != kids.end() && it->first == b) ? it->second : -1;
}

void AddedTokenMatcher::add(std::string_view content, int32_t id) {
  if (content.empty()) return;
  first_[static_cast<uint8_t>(content[0])] = true;
  int32_t node = 0;
  for (char ch : content) {
    const auto b = static_cast<uint8_t>(ch);
    int32_t c = child(node, b);
    if (c < 0) {
      c = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& kids = nodes_[node].kids;
      kids.insert(std::upper_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{-1}),
                                   [](const auto& x, const auto& y) { return x.first < y.first; }),
                  {b, c});
    }
    node = c;
  }
  nodes_[node].id = id;
}

bool AddedTokenMatcher::find(std::string_view text, size_t pos, Match* m) const {
  if (empty()) return false;
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = pos; i < text.size(); ++i) {
    if (!first_[p[i]]) continue;
    int32_t node = 0, best_id = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, p[j]);
      if (node < 0) break;
      if (nodes_[node].id >= 0) {
        best_id = nodes_[node].id;
        best_end = j + 1;
      }
    }
    if (best_id >= 0) {
      *m = {i, best_end, best_id};
      return true;
    }
  }
  return false;
}

}  // namespace moeserve
