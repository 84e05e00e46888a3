// UTF-8 helpers shared by the tokenizer: strict validation and lossy repair.
//
// "Lossy" means the replacement policy of the Unicode standard's "substitution of maximal
// subparts" (what Rust's String::from_utf8_lossy and Python's bytes.decode(errors="replace")
// do): every maximal prefix of a would-be valid sequence that cannot be completed becomes one
// U+FFFD. Surrogates (ED A0..BF) and overlong forms are invalid. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve::utf8 {

// Length of the valid UTF-8 sequence starting at s[0] (1..4), or 0 when s does not start with a
// complete valid sequence. `need_more` (optional) is set when s is a valid but truncated prefix
// of a sequence, i.e. more bytes could still complete it.
size_t valid_sequence_length(std::string_view s, bool* need_more = nullptr);

// Byte offset of the first invalid byte, or nullopt when the whole string is valid UTF-8.
std::optional<size_t> first_invalid(std::string_view s);

inline bool is_valid(std::string_view s) {
  return !first_invalid(s).has_value();
}

// Appends s to out with each maximal invalid subpart replaced by U+FFFD.
void append_lossy(std::string_view s, std::string& out);
inline std::string lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_lossy(s, out);
  return out;
}

// Length of the longest prefix of s that append_lossy would render the same no matter which bytes
// follow: everything except a trailing truncated (but so far valid) sequence.
size_t settled_prefix_length(std::string_view s);

// Appends the UTF-8 encoding of code point cp (cp < 0x110000, not a surrogate).
void append_codepoint(uint32_t cp, std::string& out);

}  // namespace moeserve::utf8
