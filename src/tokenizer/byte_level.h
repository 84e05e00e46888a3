// The GPT-2 "byte-level" alphabet used by byte-level BPE vocabularies (tokenizer.json stores
// tokens in it): each of the 256 byte values is shown as one printable code point, so that a
// token string like "Ġthe" stands for the raw bytes " the". Tables are built once, immutable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve::byte_level {

// The code point that stands for byte b.
uint32_t byte_to_codepoint(uint8_t b);

// Raw bytes of a byte-level string, or nullopt if any of its code points is outside the alphabet
// (or the string is not valid UTF-8).
std::optional<std::string> to_bytes(std::string_view byte_level_text);

// Byte-level form of raw bytes.
std::string from_bytes(std::string_view raw);

}  // namespace moeserve::byte_level
