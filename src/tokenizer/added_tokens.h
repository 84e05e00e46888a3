// AddedTokenMatcher: finds added tokens (special tokens such as <｜begin▁of▁sentence｜>, and
// non-special ones such as <｜User｜>) in text, leftmost-longest first, as Hugging Face's
// AddedVocabulary does before pre-tokenization. A byte trie; immutable after building, so
// find() is thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace moeserve {

class AddedTokenMatcher {
 public:
  AddedTokenMatcher();

  // Adds a token (non-empty content). Adding the same content twice keeps the later id.
  void add(std::string_view content, int32_t id);
  bool empty() const { return nodes_.size() == 1; }

  struct Match {
    size_t begin, end;
    int32_t id;
  };
  // The leftmost match starting at or after `pos`, the longest one among those starting there.
  bool find(std::string_view text, size_t pos, Match* m) const;

 private:
  struct Node {
    int32_t id = -1;                                // token ending here, if any
    std::vector<std::pair<uint8_t, int32_t>> kids;  // byte -> node, sorted by byte
  };
  int32_t child(int32_t node, uint8_t b) const;

  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};  // bytes that start some token
};

}  // namespace moeserve
