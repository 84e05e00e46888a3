#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace moeserve::byte_level {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // code points of the alphabet are all below 324
  Tables() {
    from_cp.fill(-1);
    // Printable Latin-1 bytes stand for themselves; the rest are shifted to 256, 257, ...
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) {
  return tables().to_cp[b];
}

std::optional<std::string> to_bytes(std::string_view text) {
  const Tables& t = tables();
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = utf8::valid_sequence_length(text.substr(i));
    if (n == 0 || n > 2) return std::nullopt;  // the alphabet is U+0021..U+0143
    uint32_t cp = static_cast<uint8_t>(text[i]);
    if (n == 2) cp = ((cp & 0x1F) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3F);
    if (cp >= t.from_cp.size() || t.from_cp[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.from_cp[cp]));
    i += n;
  }
  return out;
}

std::string from_bytes(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) utf8::append_codepoint(byte_to_codepoint(static_cast<uint8_t>(c)), out);
  return out;
}

}  // namespace moeserve::byte_level
