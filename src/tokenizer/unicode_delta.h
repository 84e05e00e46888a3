// The difference between the Unicode tables of Hugging Face's regex engine (Oniguruma in
// tokenizers 0.23: Unicode 16.0) and of PCRE2 10.42 (Unicode 14.0): code points that were
// unassigned in 14.0 and got a general category in 16.0. Generated (tools/gen_unicode_delta.py).
#pragma once

#include <string_view>

namespace moeserve {

// PCRE2 class members ("\x{1B4E}-\x{1B4F}\x{...}") of the code points whose Unicode 16.0 major
// category is `major` (one of L, M, N, P, S) and that Unicode 14.0 leaves unassigned; "" for
// other letters.
std::string_view unicode_delta_members(char major);

}  // namespace moeserve
