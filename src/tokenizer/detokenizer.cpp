#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace moeserve {

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return "";
  auto bytes = tok_.token_bytes(id);
  if (!bytes) return "";  // unknown ids are skipped, as decode() does
  pending_.append(*bytes);
  // Lossy UTF-8 decoding is a left-to-right process whose output for a prefix is final once
  // the prefix does not end inside a character that could still be completed.
  const size_t n = utf8::settled_prefix_length(pending_);
  std::string out;
  utf8::append_lossy(std::string_view(pending_).substr(0, n), out);
  pending_.erase(0, n);
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out = utf8::lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace moeserve
