// The benchmark inputs, generated identically here and in vs_hf.py (same LCG), so that both
// tokenizers see the same bytes: 1 MB of one repeated character, one 1 MB "word" of random
// letters, 1 MB of random digits, 1 MB of spaces. Sizes are parameters for the linearity check.
#pragma once

#include <cstdint>
#include <string>

namespace moeserve::bench {

// x_{n+1} = x_n * 6364136223846793005 + 1442695040888963407 (mod 2^64); use the top bits.
struct Lcg {
  uint64_t x = 42;
  uint32_t next() {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(x >> 33);
  }
};

inline std::string adversarial(const std::string& kind, size_t n) {
  std::string s;
  s.reserve(n);
  Lcg g;
  if (kind == "repeated_char") s.assign(n, 'a');
  if (kind == "spaces") s.assign(n, ' ');
  if (kind == "one_word") {
    for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>('a' + g.next() % 26));
  }
  if (kind == "digits") {
    for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>('0' + g.next() % 10));
  }
  return s;
}

}  // namespace moeserve::bench
